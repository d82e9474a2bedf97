from torch import nn

from moeoffload.kernels.expert_gemm import grouped_expert_ffn
from moeoffload.kernels.routing import route_topk


class MoEBlock(nn.Module):
    def __init__(self, cfg, layer_id, cache, prefetcher):
        super().__init__()
        self.layer_id = layer_id
        self.top_k = cfg.top_k
        self.gate = nn.Linear(cfg.hidden, cfg.num_experts, bias=False)
        self.cache = cache
        self.prefetcher = prefetcher

    def forward(self, h):
        topk_w, topk_ids = route_topk(self.gate(h), self.top_k)
        slots = self.cache.on_router_scores(self.layer_id, topk_ids)
        self.prefetcher.prefetch_next(self.layer_id, h)
        return grouped_expert_ffn(h, topk_w, slots, self.cache.w13_slots, self.cache.w2_slots)


class AttentionBlock(nn.Module):
    def __init__(self, cfg, layer_id, backend):
        super().__init__()
        self.layer_id = layer_id
        self.num_heads = cfg.num_qo_heads
        self.head_dim = cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden, cfg.num_qo_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.num_qo_heads * cfg.head_dim, cfg.hidden, bias=False)
        self.backend = backend

    def forward(self, h, fb):
        q = self.q_proj(h).view(-1, self.num_heads, self.head_dim)
        if fb.is_decode:
            o = self.backend.forward_decode(q, self.layer_id, fb)
        else:
            o = self.backend.forward_extend(q, self.layer_id, fb)
        return self.o_proj(o.reshape(h.shape[0], -1))

    def decode_graph(self, h, fb):
        q = self.q_proj(h).view(-1, self.num_heads, self.head_dim)
        o = self.backend.forward_decode(q, self.layer_id, fb)
        return self.o_proj(o.reshape(h.shape[0], -1))


class DecoderLayer(nn.Module):
    def __init__(self, cfg, layer_id, backend, cache, prefetcher):
        super().__init__()
        self.attn = AttentionBlock(cfg, layer_id, backend)
        self.moe = MoEBlock(cfg, layer_id, cache, prefetcher)
        self.norm1 = nn.RMSNorm(cfg.hidden)
        self.norm2 = nn.RMSNorm(cfg.hidden)

    def forward(self, h, fb):
        h = h + self.attn(self.norm1(h), fb)
        return h + self.moe(self.norm2(h))

    def decode_graph(self, h, fb):
        h = h + self.attn.decode_graph(self.norm1(h), fb)
        return h + self.moe(self.norm2(h))


class OffloadModel(nn.Module):
    def __init__(self, cfg, backend, cache, prefetcher):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden)
        self.layers = nn.ModuleList(
            [DecoderLayer(cfg, i, backend, cache, prefetcher) for i in range(cfg.num_layers)]
        )
        self.norm = nn.RMSNorm(cfg.hidden)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)

    def forward(self, input_ids, positions, fb):
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer(h, fb)
        return self.lm_head(self.norm(h))

    def decode_graph(self, input_ids, positions, fb):
        """Entry point of the captured decode graphs: decode attention only, no prefill branch."""
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.decode_graph(h, fb)
        return self.lm_head(self.norm(h))
