import torch
from torch import nn

from slo import SLOConfig
from slo_attn.backend import MeteredBackend


class DecodeLayer(nn.Module):
    def __init__(self, layer_id: int, cfg: SLOConfig, backend: MeteredBackend):
        super().__init__()
        self.layer_id = layer_id
        self.backend = backend
        self.cfg = cfg
        self.kv_dim = cfg.num_kv_heads * cfg.head_dim
        self.norm = nn.RMSNorm(cfg.hidden)
        self.qkv = nn.Linear(cfg.hidden, cfg.hidden + 2 * self.kv_dim, bias=False)
        self.o_proj = nn.Linear(cfg.hidden, cfg.hidden, bias=False)
        self.mlp = nn.Sequential(nn.RMSNorm(cfg.hidden), nn.Linear(cfg.hidden, 4 * cfg.hidden, bias=False), nn.GELU(),
                                 nn.Linear(4 * cfg.hidden, cfg.hidden, bias=False))

    def forward(self, h: torch.Tensor, out_loc: torch.Tensor, bs: int) -> torch.Tensor:
        cfg = self.cfg
        q, k, v = self.qkv(self.norm(h)).split([cfg.hidden, self.kv_dim, self.kv_dim], dim=-1)
        self.backend.write_kv(self.layer_id, k.view(-1, cfg.num_kv_heads, cfg.head_dim),
                              v.view(-1, cfg.num_kv_heads, cfg.head_dim), out_loc)
        o = self.backend.forward_decode(self.layer_id, q.view(-1, cfg.num_qo_heads, cfg.head_dim), bs)
        h = h + self.o_proj(o.reshape(h.shape[0], -1))
        return h + self.mlp(h)


class DecodeModel(nn.Module):
    def __init__(self, cfg: SLOConfig, backend: MeteredBackend):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden)
        self.layers = nn.ModuleList([DecodeLayer(i, cfg, backend) for i in range(cfg.num_layers)])
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)

    def forward(self, input_ids, out_loc, temperature: torch.Tensor, bs: int) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer(h, out_loc, bs)
        return self.lm_head(h).float() / temperature.unsqueeze(-1)
