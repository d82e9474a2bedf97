import flashinfer
import torch
from torch import nn

from td_engine.backend import TelemetryAttnBackend
from td_engine.config import EngineConfig


class TDLayer(nn.Module):
    def __init__(self, cfg: EngineConfig, layer_id: int, backend: TelemetryAttnBackend):
        super().__init__()
        self.cfg = cfg
        self.layer_id = layer_id
        self.backend = backend
        q_size = cfg.num_qo_heads * cfg.head_dim
        kv_size = cfg.num_kv_heads * cfg.head_dim
        self.sizes = (q_size, kv_size, kv_size)
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.qkv = nn.Linear(cfg.hidden_size, q_size + 2 * kv_size, bias=True)
        self.o_proj = nn.Linear(q_size, cfg.hidden_size, bias=False)

    def _q(self, h: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        q, k, _ = self.qkv(self.norm(h)).split(self.sizes, dim=-1)
        c = self.cfg
        q, _ = flashinfer.apply_rope_pos_ids(
            q.view(-1, c.num_qo_heads, c.head_dim), k.view(-1, c.num_kv_heads, c.head_dim), positions
        )
        return q

    def forward_decode(self, h, positions, kv_cache, bs: int):
        o = self.backend.forward_decode(self._q(h, positions), kv_cache[self.layer_id], bs)
        return h + self.o_proj(o.reshape(h.shape[0], -1))

    def forward_prefill(self, h, positions, kv_cache):
        o = self.backend.forward_prefill(self._q(h, positions), kv_cache[self.layer_id])
        return h + self.o_proj(o.reshape(h.shape[0], -1))


class TDModel(nn.Module):
    def __init__(self, cfg: EngineConfig, backend: TelemetryAttnBackend):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([TDLayer(cfg, i, backend) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward_decode(self, tokens, positions, kv_cache, bs: int):
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer.forward_decode(h, positions, kv_cache, bs)
        return self.lm_head(self.norm(h))

    def forward_prefill(self, tokens, positions, kv_cache):
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer.forward_prefill(h, positions, kv_cache)
        return self.lm_head(self.norm(h))
