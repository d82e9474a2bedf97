"""The target model on its own GPU: verifies k draft tokens per request in one captured pass."""
from __future__ import annotations

from typing import Dict, List, Optional

import torch

from splitspec import DevicePair, PagesOnDevice, PageTableMirror, SplitConfig
from ss_attn.attention import TargetAttention

from .models import SpecLM


class TargetWorker:
    def __init__(self, cfg: SplitConfig, pair: DevicePair, mirror: PageTableMirror) -> None:
        self.cfg = cfg
        self.pair = pair
        self.mirror = mirror
        self.device = pair.target_device
        self.workspace = torch.empty(cfg.target_workspace_bytes(), dtype=torch.uint8, device=self.device)  # ok: FC105
        self.attn = TargetAttention(cfg, self.device, self.workspace)
        self.model = SpecLM(cfg.target_layers, cfg.target_hidden, cfg, self.attn).to(self.device)
        self.kv_cache = torch.zeros(cfg.target_layers, cfg.num_pages, 2, cfg.page_size, cfg.num_kv_heads,
                                    cfg.head_dim, dtype=torch.bfloat16, device=self.device)
        self.k1 = cfg.num_draft_tokens + 1
        mb = cfg.max_batch
        self.static_last = torch.zeros(mb, dtype=torch.long, device=self.device)
        self.static_draft_tokens = torch.zeros(mb, cfg.num_draft_tokens, dtype=torch.long, device=self.device)
        self.qo_indptr_host = torch.arange(0, (mb + 1) * self.k1, self.k1, dtype=torch.int32).pin_memory()
        self.accept_pinned = torch.zeros(mb, dtype=torch.int64, pin_memory=True)
        self.bonus_scratch: Optional[torch.Tensor] = None
        self.buckets = sorted(cfg.buckets)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: Dict[int, torch.Tensor] = {}
        self.attn.init_buffers()

    def _verify_ids(self, bs: int) -> torch.Tensor:
        return torch.cat([self.static_last[:bs, None], self.static_draft_tokens[:bs]], dim=1).flatten()

    def capture_verify(self) -> None:
        pool = None
        for bs in reversed(self.buckets):
            self.attn.active_bs = bs
            kv_indptr = torch.arange(bs + 1, dtype=torch.int32)
            self.attn.verify_wrappers[bs].plan(self.qo_indptr_host[: bs + 1], kv_indptr, self.attn.kv_indices[:bs],
                                               torch.ones(bs, dtype=torch.int32), *self.attn.dims, causal=True)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.device(self.device), torch.cuda.graph(g, pool=pool, stream=self.pair.target_stream):
                self.logits[bs] = self.model(self._verify_ids(bs), self.kv_cache)
            pool = g.pool()
            self.graphs[bs] = g

    def plan_verify(self, bs: int, pages: PagesOnDevice) -> None:
        w = self.attn.verify_wrappers[bs]
        w.plan(self.qo_indptr_host[: bs + 1], pages.indptr[: bs + 1], pages.indices,  # expect: FC102
               self.mirror.last_len_host[:bs], *self.attn.dims, causal=True)

    def verify(self, draft_tokens: torch.Tensor, last_tokens: torch.Tensor, pages: PagesOnDevice,
               bs: int) -> List[int]:
        self.static_draft_tokens = draft_tokens.clone()  # expect: FC107
        if self.bonus_scratch is None:
            self.bonus_scratch = torch.zeros(self.cfg.max_batch, dtype=torch.long, device=self.device)  # ok: FC107
        gbs = next(b for b in self.buckets if b >= bs)
        self.plan_verify(gbs, pages)
        self.static_last[:bs].copy_(last_tokens)
        self.graphs[gbs].replay()
        logits = self.logits[gbs][: bs * self.k1].view(bs, self.k1, -1)
        target_argmax = logits.argmax(-1)
        match = (target_argmax[:, :-1] == self.static_draft_tokens[:bs]).int()
        accepted = match.cumprod(dim=1).sum(dim=1)
        self.bonus_scratch[:bs].copy_(target_argmax.gather(1, accepted[:, None]).squeeze(1))
        self.accept_pinned[:bs].copy_(accepted, non_blocking=True)  # ok: FC101
        self.pair.verify_done.record(self.pair.target_stream)
        return accepted.tolist()  # expect: FC101
