import torch
from torch import nn
from diengine.batch import ForwardBatch
from diengine.config import EngineConfig
from diengine.interfaces import AttentionBackend


@torch.jit.script
def clamp_positions(positions: torch.Tensor, max_pos: int) -> torch.Tensor:
    assert positions.dim() == 1  # ok: FC109
    return positions.clamp(0, max_pos - 1)

class AttentionLayer(nn.Module):
    def __init__(self, layer_id: int, config: EngineConfig, backend: AttentionBackend):
        super().__init__()
        self.layer_id = layer_id
        self.backend = backend
        self.sliding_window = 4096 if layer_id % 4 == 3 else -1
        self.logits_soft_cap = 30.0 if layer_id == 0 else 0.0
        self.uses_paged_prefix = layer_id % 2 == 1
        qh, kh, d = config.num_qo_heads, config.num_kv_heads, config.head_dim
        self.split, self.head_dim = [qh * d, kh * d, kh * d], d
        self.qkv = nn.Linear(qh * d, sum(self.split), bias=False)
        self.o = nn.Linear(qh * d, qh * d, bias=False)

    def decode(self, h, fb: ForwardBatch):
        q = self.qkv(h)[:, : self.split[0]].unflatten(-1, (-1, self.head_dim))
        return self.o(self.backend.forward_decode(q, self, fb).flatten(1))

    def forward(self, h, fb: ForwardBatch):
        q, k, v = (t.unflatten(-1, (-1, self.head_dim)) for t in self.qkv(h).split(self.split, dim=-1))
        return self.o(self.backend.forward_extend(q, k, v, self, fb).flatten(1))

class DecoderModel(nn.Module):
    def __init__(self, config: EngineConfig, backend: AttentionBackend):
        super().__init__()
        self.cfg = config
        hidden = config.num_qo_heads * config.head_dim
        self.embed = nn.Embedding(128256, hidden)
        self.rel_pos_embed = nn.Embedding(config.max_context, hidden)
        self.layers = nn.ModuleList([AttentionLayer(i, config, backend) for i in range(32)])
        self.lm_head = nn.Linear(hidden, 128256, bias=False)

    def decode(self, input_ids, positions, fb: ForwardBatch):
        h = self.embed(input_ids) + self.rel_pos_embed(clamp_positions(positions, self.cfg.max_context))
        for layer in self.layers:
            h = h + layer.decode(h, fb)
        return self.lm_head(h)

    def forward(self, fb: ForwardBatch):
        h = self.embed(fb.input_ids)
        req_ids = torch.arange(fb.batch_size, device=h.device)
        token_req = torch.repeat_interleave(req_ids, fb.extend_lens, output_size=fb.num_tokens)  # ok: FC101
        starts = torch.cumsum(fb.extend_lens, 0) - fb.extend_lens
        token_start = torch.repeat_interleave(starts, fb.extend_lens)  # expect: FC101
        offsets = torch.arange(fb.num_tokens, device=h.device) - token_start
        h = h + self.rel_pos_embed(clamp_positions(fb.prefix_lens[token_req] + offsets, self.cfg.max_context))
        for layer in self.layers:
            h = h + layer(h, fb)
        last = torch.where(fb.extend_lens > 0, starts + fb.extend_lens - 1, starts)  # ok: FC101
        return self.lm_head(h.index_select(0, last))
