"""Draft (two layers, EAGLE-style fusion) and target models over one page table and two KV caches."""

import torch
from torch import nn

from dualspec.config import SpecConfig
from dualspec.shared_bufs import SharedPageBuffers
from specrt.batch import DraftContext, VerifyContext


class DualKVCache:
    def __init__(self, cfg: SpecConfig, device, dtype=torch.float16):
        shape = (cfg.max_total_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.draft = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.draft_layers)]
        self.target = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.target_layers)]


class AttnBlock(nn.Module):
    def __init__(self, cfg: SpecConfig, cache):
        super().__init__()
        self.nq = cfg.num_qo_heads
        self.nkv = cfg.num_kv_heads
        self.hd = cfg.head_dim
        self.cache = cache
        self.qkv = nn.Linear(cfg.hidden, (self.nq + 2 * self.nkv) * self.hd, bias=False)
        self.o = nn.Linear(self.nq * self.hd, cfg.hidden, bias=False)
        self.norm = nn.RMSNorm(cfg.hidden)
        self.mlp = nn.Sequential(nn.Linear(cfg.hidden, 3 * cfg.hidden), nn.SiLU(), nn.Linear(3 * cfg.hidden, cfg.hidden))

    def project(self, h, write_pages, write_offsets):
        q, k, v = self.qkv(self.norm(h)).split([self.nq * self.hd, self.nkv * self.hd, self.nkv * self.hd], dim=-1)
        self.cache[write_pages, 0, write_offsets] = k.view(-1, self.nkv, self.hd)
        self.cache[write_pages, 1, write_offsets] = v.view(-1, self.nkv, self.hd)
        return q.view(-1, self.nq, self.hd)

    def finish(self, h, o):
        h = h + self.o(o.reshape(-1, self.nq * self.hd))
        return h + self.mlp(h)


class DraftLayer(AttnBlock):
    def forward(self, h, ctx: DraftContext):
        q = self.project(h, ctx.write_pages, ctx.write_offsets)
        o = ctx.wrapper.run(q, self.cache)  # ok: FC108
        return self.finish(h, o)


class TargetLayer(AttnBlock):
    def forward(self, h, ctx: VerifyContext):
        q = self.project(h, ctx.write_pages, ctx.write_offsets)
        o = ctx.wrapper.run(q, self.cache)
        return self.finish(h, o)


class DraftModel(nn.Module):
    def __init__(self, cfg: SpecConfig, shared: SharedPageBuffers, caches: list, device):
        super().__init__()
        self.shared = shared
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.fuse = nn.Linear(2 * cfg.hidden, cfg.hidden, bias=False)
        self.layers = nn.ModuleList([DraftLayer(cfg, c) for c in caches])
        self.norm = nn.RMSNorm(cfg.hidden)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)

    def forward_draft(self, ctx: DraftContext):
        h = self.fuse(torch.cat([self.embed(ctx.input_ids), ctx.hidden], dim=-1))
        for layer in self.layers:
            h = layer(h, ctx)
        return self.lm_head(self.norm(h)), h

    def extend_from_verify(self, target_hidden, ctx: VerifyContext):
        """Run the draft's first layer over the verified rows so its KV is ready for the next draft step."""
        first = self.layers[0]
        h = self.fuse(torch.cat([self.embed(ctx.token_ids), target_hidden], dim=-1))
        q = first.project(h, ctx.write_pages, ctx.write_offsets)
        o = self.shared.extend_wrapper.run(q, first.cache)  # expect: FC108
        return first.finish(h, o)


class TargetModel(nn.Module):
    def __init__(self, cfg: SpecConfig, caches: list, draft: DraftModel, device):
        super().__init__()
        self.draft = draft
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.layers = nn.ModuleList([TargetLayer(cfg, c) for c in caches])
        self.norm = nn.RMSNorm(cfg.hidden)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)

    def verify(self, ctx: VerifyContext):
        h = self.embed(ctx.token_ids)
        for layer in self.layers:
            h = layer(h, ctx)
        self.draft.extend_from_verify(h, ctx)
        return self.lm_head(self.norm(h)), h
