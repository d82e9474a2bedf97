import torch
from torch import nn

from lckv import OffloadConfig
from lc_attn.backend import WindowAttnBackend


def apply_rope(x: torch.Tensor, positions: torch.Tensor, theta: float = 500000.0) -> torch.Tensor:
    half = x.shape[-1] // 2
    freqs = theta ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    ang = positions[:, None].float() * freqs[None]
    cos, sin = ang.cos()[:, None], ang.sin()[:, None]
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


class WindowLayer(nn.Module):
    def __init__(self, cfg: OffloadConfig, layer_id: int, backend: WindowAttnBackend):
        super().__init__()
        self.layer_id = layer_id
        self.backend = backend
        self.nq, self.nkv, self.hd = cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim
        hidden = cfg.num_qo_heads * cfg.head_dim
        self.norm = nn.RMSNorm(hidden)
        self.qkv = nn.Linear(hidden, (self.nq + 2 * self.nkv) * self.hd, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)
        self.mlp = nn.Sequential(nn.RMSNorm(hidden), nn.Linear(hidden, cfg.intermediate_size, bias=False),
                                 nn.SiLU(), nn.Linear(cfg.intermediate_size, hidden, bias=False))

    def _qkv(self, h: torch.Tensor, positions: torch.Tensor):
        q, k, v = self.qkv(self.norm(h)).split([self.nq * self.hd, self.nkv * self.hd, self.nkv * self.hd], -1)
        q = apply_rope(q.view(-1, self.nq, self.hd), positions)
        k = apply_rope(k.view(-1, self.nkv, self.hd), positions)
        return q, k, v.view(-1, self.nkv, self.hd)

    def forward(self, h: torch.Tensor, positions: torch.Tensor, bs: int) -> torch.Tensor:
        q, _, _ = self._qkv(h, positions)  # the new token's K/V is appended by the step's append kernel
        h = h + self.o_proj(self.backend.window_attention(q, self.layer_id, bs).flatten(1))
        return h + self.mlp(h)

    def forward_chunk(self, h: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        q, _, _ = self._qkv(h, positions)
        h = h + self.o_proj(self.backend.chunk_attention(q, self.layer_id).flatten(1))
        return h + self.mlp(h)


class WindowDecoder(nn.Module):
    def __init__(self, cfg: OffloadConfig, backend: WindowAttnBackend):
        super().__init__()
        hidden = cfg.num_qo_heads * cfg.head_dim
        self.group = cfg.layers_per_group
        self.embed = nn.Embedding(cfg.vocab_size, hidden)
        self.layers = nn.ModuleList([WindowLayer(cfg, i, backend) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(hidden)
        self.lm_head = nn.Linear(hidden, cfg.vocab_size, bias=False)

    def forward_group(self, g: int, h: torch.Tensor, positions: torch.Tensor, bs: int) -> torch.Tensor:
        for layer in self.layers[g * self.group : (g + 1) * self.group]:
            h = layer(h, positions, bs)
        return h

    def forward_chunk(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        for layer in self.layers:
            h = layer.forward_chunk(h, positions)
        return self.head(h[-1:])

    def head(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(h))
