"""DeepSeek-V3-shaped decoder: MLA with absorbed weights (sparse top-k after the first layers) and MoE."""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn as nn

from mtm.config import EngineConfig
from mtm.indexer.lightning import SparseIndexer
from mtm.kvcache import ForwardBatch, MLAKVPool
from mtm.moe.fused_moe import FusedMoE
from mtm.parallel.tp import TPGroup
from mtm.weights import absorb_output, absorb_query, absorb_weights, rope_interleaved
from mtm_engine.backends import FlashInferMLABackend


@torch.compile(dynamic=True)
def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


class DeepseekMLAAttention(nn.Module):
    def __init__(self, cfg: EngineConfig, layer_id: int, backend: FlashInferMLABackend, kv_pool: MLAKVPool, tp: TPGroup):
        super().__init__()
        m = cfg.model
        self.layer_id, self.backend, self.kv_pool, self.tp = layer_id, backend, kv_pool, tp
        self.h = cfg.local_heads
        self.nope, self.rope, self.lora, self.v = m.qk_nope_head_dim, m.qk_rope_head_dim, m.kv_lora_rank, m.v_head_dim
        self.q_a_proj = nn.Linear(m.hidden_size, m.q_lora_rank, bias=False)
        self.q_b_proj = nn.Linear(m.q_lora_rank, self.h * (self.nope + self.rope), bias=False)
        self.kv_a_proj = nn.Linear(m.hidden_size, self.lora + self.rope, bias=False)
        self.kv_b_proj = nn.Linear(self.lora, self.h * (self.nope + self.v), bias=False)
        self.o_proj = nn.Linear(self.h * self.v, m.hidden_size, bias=False)
        self.norms = nn.ParameterDict({"q": nn.Parameter(torch.ones(m.q_lora_rank)), "kv": nn.Parameter(torch.ones(self.lora))})
        freqs = torch.outer(torch.arange(cfg.max_context_len).float(), 10000 ** (-torch.arange(0, self.rope, 2).float() / self.rope))
        self.register_buffer("cos", freqs.cos(), persistent=False)
        self.register_buffer("sin", freqs.sin(), persistent=False)
        self.w_kc: Optional[torch.Tensor] = None  # absorbed in post_load_weights
        self.w_vc: Optional[torch.Tensor] = None
        self.indexer: Optional[SparseIndexer] = None
        if layer_id >= m.sparse_from_layer:
            self.indexer = SparseIndexer(cfg, layer_id, m.index_topk, backend, kv_pool)

    def post_load_weights(self) -> None:
        w = self.kv_b_proj.weight.view(self.h, self.nope + self.v, self.lora)
        self.w_kc, self.w_vc = absorb_weights(w[:, : self.nope], w[:, self.nope :], self.h)

    def _project(self, h: torch.Tensor, fb: ForwardBatch) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q_lora = rms_norm(self.q_a_proj(h), self.norms["q"])
        q_nope, q_pe = self.q_b_proj(q_lora).view(-1, self.h, self.nope + self.rope).split([self.nope, self.rope], dim=-1)
        ckv, k_pe = self.kv_a_proj(h).split([self.lora, self.rope], dim=-1)
        cos, sin = self.cos[fb.positions], self.sin[fb.positions]
        q_pe = rope_interleaved(q_pe, cos.unsqueeze(1), sin.unsqueeze(1))
        k_pe = rope_interleaved(k_pe, cos, sin)
        latent = torch.cat([rms_norm(ckv, self.norms["kv"]), k_pe], dim=-1)
        self.kv_pool.kv[self.layer_id][fb.out_cache_loc, 0] = latent.to(torch.bfloat16)
        return q_lora, absorb_query(q_nope, self.w_kc), q_pe

    def forward_decode(self, h: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        q_lora, q_nope, q_pe = self._project(h, fb)
        if self.indexer is not None:
            self.indexer(h, q_lora, fb)
            o = self.backend.forward_sparse_decode(q_nope, q_pe, self.layer_id)
        else:
            o = self.backend.forward_decode(q_nope, q_pe, self.layer_id)
        return self.tp.all_reduce(self.o_proj(absorb_output(o, self.w_vc)))

    def forward_extend(self, h: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        _, q_nope, q_pe = self._project(h, fb)
        o = self.backend.forward_extend(q_nope, q_pe, self.layer_id)
        return self.tp.all_reduce(self.o_proj(absorb_output(o, self.w_vc)))


class DeepseekLayer(nn.Module):
    def __init__(self, cfg: EngineConfig, layer_id: int, backend: FlashInferMLABackend, kv_pool: MLAKVPool, tp: TPGroup):
        super().__init__()
        m = cfg.model
        self.attn = DeepseekMLAAttention(cfg, layer_id, backend, kv_pool, tp)
        self.mlp = FusedMoE(cfg, tp)
        self.norms = nn.Parameter(torch.ones(2, m.hidden_size))

    def forward_decode(self, h: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        h = h + self.attn.forward_decode(rms_norm(h, self.norms[0]), fb)
        return h + self.mlp(rms_norm(h, self.norms[1]))

    def forward_extend(self, h: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        h = h + self.attn.forward_extend(rms_norm(h, self.norms[0]), fb)
        return h + self.mlp(rms_norm(h, self.norms[1]))


class DeepseekModel(nn.Module):
    def __init__(self, cfg: EngineConfig, backend: FlashInferMLABackend, kv_pool: MLAKVPool, tp: TPGroup):
        super().__init__()
        m = cfg.model
        self.embed = nn.Embedding(m.vocab_size, m.hidden_size)
        self.layers = nn.ModuleList([DeepseekLayer(cfg, i, backend, kv_pool, tp) for i in range(m.num_layers)])
        self.final_norm = nn.Parameter(torch.ones(m.hidden_size))
        self.lm_head = nn.Linear(m.hidden_size, m.vocab_size, bias=False)

    def post_load_weights(self) -> None:
        for layer in self.layers:
            layer.attn.post_load_weights()

    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        return self.forward_decode(fb) if fb.is_decode else self.forward_extend(fb)

    def forward_decode(self, fb: ForwardBatch) -> torch.Tensor:
        h = self.embed(fb.input_ids)
        for layer in self.layers:
            h = layer.forward_decode(h, fb)
        return self.lm_head(rms_norm(h, self.final_norm))

    def forward_extend(self, fb: ForwardBatch) -> torch.Tensor:
        h = self.embed(fb.input_ids)
        for layer in self.layers:
            h = layer.forward_extend(h, fb)
        last = (torch.cumsum(fb.extend_lens_cpu, 0) - 1).to(h.device, non_blocking=True)
        return self.lm_head(rms_norm(h.index_select(0, last), self.final_norm))
