"""The draft model on its own GPU: k draft steps, one captured step per bucket."""
from __future__ import annotations

import functools
from typing import Dict, Optional

import torch

from splitspec import DRAFT_WORKSPACE_BYTES, DevicePair, PagesOnDevice, PageTableMirror, SpecBatch, SplitConfig
from ss_attn.attention import DraftAttention

from .models import SpecLM


class DraftWorker:
    def __init__(self, cfg: SplitConfig, pair: DevicePair, mirror: PageTableMirror) -> None:
        self.cfg = cfg
        self.pair = pair
        self.mirror = mirror
        self.device = pair.draft_device
        self.workspace = torch.zeros(DRAFT_WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)  # expect: FC106
        self.attn = DraftAttention(cfg, self.device, self.workspace)
        self.model = SpecLM(cfg.draft_layers, cfg.draft_hidden, cfg, self.attn).to(self.device)
        self.kv_cache = torch.zeros(cfg.draft_layers, cfg.num_pages, 2, cfg.page_size, cfg.num_kv_heads,
                                    cfg.head_dim, dtype=torch.bfloat16, device=self.device)
        mb = cfg.max_batch
        self.static_tokens = torch.zeros(mb, dtype=torch.long, device=self.device)
        self.out_tokens = torch.zeros(mb, dtype=torch.long, device=self.device)
        self.drafts = torch.zeros(mb, cfg.num_draft_tokens, dtype=torch.long, device=self.device)
        self.catchup_qo_host = torch.zeros(mb + 1, dtype=torch.int32, pin_memory=True)
        self.buckets = sorted(cfg.buckets)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.attn.init_buffers()

    def bucket_for(self, bs: int) -> Optional[int]:
        return next((b for b in self.buckets if b >= bs), None)

    def plan_capture(self, bs: int) -> None:
        indptr = torch.arange(bs + 1, dtype=torch.int32)
        last = torch.ones(bs, dtype=torch.int32)
        self.attn.decode_wrappers[bs].plan(indptr, self.attn.kv_indices[:bs], last, *self.attn.dims)
        self.attn.catchup.plan(torch.zeros(bs + 1, dtype=torch.int32), indptr, self.attn.kv_indices[:bs], last,
                               *self.attn.dims)

    def capture_draft(self) -> None:
        pool = None
        for bs in reversed(self.buckets):
            self.attn.active_bs = bs
            self.plan_capture(bs)
            with torch.cuda.device(self.device):
                self.model(self.static_tokens[:bs], self.kv_cache)
                torch.cuda.synchronize(self.device)  # ok: FC101
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=pool, stream=self.pair.draft_stream):
                    self.out_tokens[:bs] = self.model(self.static_tokens[:bs], self.kv_cache).argmax(-1)
            pool = g.pool()
            self.graphs[bs] = g

    def plan_draft(self, bs: int, pages: PagesOnDevice, step_i: int) -> None:
        w = self.attn.decode_wrappers[bs]
        nq, nkv, hd, ps = self.attn.dims
        if step_i == 0:
            self.attn.kv_indptr[: bs + 1].copy_(self.mirror.indptr_host[: bs + 1], non_blocking=True)  # ok: FC104
            self.attn.kv_indices[: pages.num_pages].copy_(pages.indices[: pages.num_pages], non_blocking=True)
            w.plan(self.mirror.indptr_host[: bs + 1], pages.indices, self.mirror.last_len_host[:bs],  # ok: FC102
                   nq, nkv, hd, ps)
            self.attn.catchup.plan(self.catchup_qo_host[: bs + 1], self.mirror.indptr_host[: bs + 1],  # ok: FC102
                                   pages.indices, self.mirror.last_len_host[:bs], nq, nkv, hd, ps)
        else:
            step_plan = functools.partial(w.plan, num_qo_heads=nq, num_kv_heads=nkv, head_dim=hd, page_size=ps)
            last = self.mirror.advance_last(self.device, bs, step_i)
            step_plan(self.mirror.indptr_host[: bs + 1], pages.indices, last)  # expect: FC102

    def propose(self, batch: SpecBatch, pages: PagesOnDevice) -> torch.Tensor:
        bs = len(batch.slots)
        longest = int(batch.seq_lens_cpu.max())  # ok: FC101
        if longest + self.cfg.num_draft_tokens > self.cfg.max_model_len:
            raise ValueError(f"a sequence of {longest} tokens leaves no room to draft")
        steps = min(self.cfg.num_draft_tokens, self.cfg.max_model_len - int(batch.lens_on_draft.max()))  # expect: FC101
        gbs = self.bucket_for(bs)
        tokens = batch.last_tokens
        with torch.cuda.stream(self.pair.draft_stream):
            for i in range(steps):
                self.plan_draft(gbs, pages, i)
                self.static_tokens[:bs].copy_(tokens)
                self.graphs[gbs].replay()
                tokens = self.out_tokens[:bs]
                self.drafts[:bs, i].copy_(tokens)
            self.pair.draft_done.record(self.pair.draft_stream)
        return self.drafts[:bs, :steps]
