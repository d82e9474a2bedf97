"""A decoder with global layers (graph-mode decode wrappers) and chunked local layers (Llama-4 style)."""

import torch
from torch import nn

from asyncserve.config import AsyncEngineConfig
from asyncserve.protocol import DevicePlan
from gpu.attn_backend import AsyncFlashInferBackend


class DynamicRotary(nn.Module):
    """NTK-scaled rotary embedding: the base grows with each token's sequence length."""

    def __init__(self, head_dim: int, original_max: int, base: float = 500000.0):
        super().__init__()
        self.head_dim = head_dim
        self.original_max = original_max
        self.base = base
        self.register_buffer("exponents", torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim, persistent=False)

    def forward(self, x, positions, ctx_lens):
        scale = torch.clamp(ctx_lens.float() / self.original_max, min=1.0)
        base = self.base * scale ** (self.head_dim / (self.head_dim - 2))
        inv = 1.0 / (base.unsqueeze(-1) ** self.exponents)
        ang = positions.float().unsqueeze(-1) * inv
        cos = ang.cos().unsqueeze(1).to(x.dtype)
        sin = ang.sin().unsqueeze(1).to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class _AttnBase(nn.Module):
    def __init__(self, cfg: AsyncEngineConfig, backend: AsyncFlashInferBackend, cache):
        super().__init__()
        self.backend = backend
        self.cache = cache
        self.nq, self.nkv, self.hd = cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim
        self._sm_scale = cfg.head_dim**-0.5
        self.qkv = nn.Linear(cfg.hidden, (self.nq + 2 * self.nkv) * self.hd, bias=False)
        self.o = nn.Linear(self.nq * self.hd, cfg.hidden, bias=False)
        self.norm = nn.RMSNorm(cfg.hidden)
        self.mlp = nn.Sequential(nn.Linear(cfg.hidden, 4 * cfg.hidden), nn.SiLU(), nn.Linear(4 * cfg.hidden, cfg.hidden))
        self.rope = DynamicRotary(cfg.head_dim, cfg.rope_original_max)

    def _project(self, h, plan: DevicePlan, ctx_lens):
        q, k, v = self.qkv(self.norm(h)).split([self.nq * self.hd, self.nkv * self.hd, self.nkv * self.hd], dim=-1)
        q = self.rope(q.view(-1, self.nq, self.hd), plan.positions, ctx_lens)
        k = self.rope(k.view(-1, self.nkv, self.hd), plan.positions, ctx_lens)
        self.cache[plan.write_pages, 0, plan.write_offsets] = k
        self.cache[plan.write_pages, 1, plan.write_offsets] = v.view(-1, self.nkv, self.hd)
        return q

    def _finish(self, h, o):
        h = h + self.o(o.reshape(-1, self.nq * self.hd))
        return h + self.mlp(h)

    def extend(self, h, plan: DevicePlan, ctx_lens):
        q = self._project(h, plan, ctx_lens)
        return self._finish(h, self.backend.forward_extend(q, self.cache))


class GlobalLayer(_AttnBase):
    def decode(self, h, plan: DevicePlan):
        q = self._project(h, plan, plan.seq_lens_dev)
        return self._finish(h, self.backend.forward_decode(q, self.cache, self, plan))


class ChunkedLayer(_AttnBase):
    def decode(self, h, plan: DevicePlan):
        q = self._project(h, plan, plan.seq_lens_dev)
        o = self.backend.chunk_wrapper.run(q, self.cache)  # expect: FC108
        return self._finish(h, o)


class AsyncLM(nn.Module):
    def __init__(self, cfg: AsyncEngineConfig, backend: AsyncFlashInferBackend, device, dtype=torch.float16):
        super().__init__()
        shape = (cfg.max_total_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        layers = []
        for i in range(cfg.num_layers):
            cache = torch.zeros(shape, dtype=dtype, device=device)
            if (i + 1) % cfg.chunk_every == 0:
                layers.append(GlobalLayer(cfg, backend, cache))
            else:
                layers.append(ChunkedLayer(cfg, backend, cache))
        self.layers = nn.ModuleList(layers)
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.norm = nn.RMSNorm(cfg.hidden)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)

    def forward_decode(self, plan: DevicePlan):
        h = self.embed(plan.input_ids)
        for layer in self.layers:
            h = layer.decode(h, plan)
        return self.lm_head(self.norm(h))

    def forward_extend(self, plan: DevicePlan):
        h = self.embed(plan.input_ids)
        rows = torch.arange(plan.bs, device=plan.input_ids.device)
        token_row = torch.repeat_interleave(rows, plan.extend_lens_dev, output_size=plan.num_tokens)  # ok: FC101
        ctx_lens = plan.seq_lens_dev[token_row]
        for layer in self.layers:
            h = layer.extend(h, plan, ctx_lens)
        last = (plan.qo_indptr_dev[1 : plan.bs + 1] - 1).long()
        return self.lm_head(self.norm(h[last]))
