import torch
from torch import nn

from bieval import InvariantConfig, counter_uniform
from bi_attn.backend import InvariantBackend


class InvariantLayer(nn.Module):
    def __init__(self, cfg: InvariantConfig, layer_id: int, backend: InvariantBackend):
        super().__init__()
        self.layer_id = layer_id
        self.backend = backend
        self.nq, self.nkv, self.hd = cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim
        h = cfg.hidden_size
        self.norm = nn.RMSNorm(h)
        self.qkv = nn.Linear(h, (self.nq + 2 * self.nkv) * self.hd, bias=False)
        self.o_proj = nn.Linear(h, h, bias=False)
        self.mlp = nn.Sequential(nn.RMSNorm(h), nn.Linear(h, cfg.intermediate_size, bias=False), nn.GELU(),
                                 nn.Linear(cfg.intermediate_size, h, bias=False))

    def forward(self, x: torch.Tensor, slots: torch.Tensor, kv_cache: torch.Tensor, bucket) -> torch.Tensor:
        q, k, v = self.qkv(self.norm(x)).split([self.nq * self.hd, self.nkv * self.hd, self.nkv * self.hd], -1)
        page = kv_cache.shape[2]
        kv_cache[slots // page, 0, slots % page] = k.view(-1, self.nkv, self.hd)
        kv_cache[slots // page, 1, slots % page] = v.view(-1, self.nkv, self.hd)
        attn = self.backend.attend(q.view(-1, self.nq, self.hd), kv_cache, self.layer_id, bucket)
        x = x + self.o_proj(attn.flatten(1))
        return x + self.mlp(x)


class InvariantModel(nn.Module):
    def __init__(self, cfg: InvariantConfig, backend: InvariantBackend):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([InvariantLayer(cfg, i, backend) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        shape = (cfg.max_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv_caches = [torch.zeros(shape, dtype=cfg.dtype, device=cfg.device) for _ in range(cfg.num_layers)]

    def forward(self, ids: torch.Tensor, slots: torch.Tensor, bucket=None) -> torch.Tensor:
        x = self.embed(ids)
        for layer, kv in zip(self.layers, self.kv_caches):
            x = layer(x, slots, kv, bucket)
        return self.lm_head(self.norm(x)).float()


def sample_rows(logits: torch.Tensor, seeds: torch.Tensor, offsets: torch.Tensor,
                temperature: torch.Tensor) -> torch.Tensor:
    """Gumbel-max with counter-based noise: greedy rows have temperature 0."""
    u = counter_uniform(seeds, offsets, logits.shape[-1]).clamp_(1e-20, 1.0)
    gumbel = -torch.log(-torch.log(u))
    scaled = logits / temperature.clamp(min=1e-5)[:, None]
    noisy = torch.where(temperature[:, None] > 0, scaled + gumbel, logits)
    return noisy.argmax(dim=-1)
