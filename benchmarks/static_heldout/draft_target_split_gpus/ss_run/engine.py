from __future__ import annotations

from typing import Dict, List

import torch

from splitspec import DevicePair, PageTableMirror, SpecBatch, SplitConfig, hand_off
from ss_attn.introspect import misplaced

from .draft import DraftWorker
from .target import TargetWorker


class SplitSpecEngine:
    def __init__(self, cfg: SplitConfig) -> None:
        self.cfg = cfg
        self.pair = DevicePair(torch.device(cfg.draft_device), torch.device(cfg.target_device))
        self.mirror = PageTableMirror(cfg, [self.pair.draft_device, self.pair.target_device])
        self.draft = DraftWorker(cfg, self.pair, self.mirror)
        self.target = TargetWorker(cfg, self.pair, self.mirror)
        self.page_lists: Dict[int, List[int]] = {}
        bad = misplaced(self.draft.attn)
        if bad:
            raise RuntimeError(f"workspaces on the wrong GPU: {bad}")

    def capture(self) -> None:
        self.draft.capture_draft()
        self.target.capture_verify()

    def make_batch(self, slots: List[int], seq_lens_cpu: torch.Tensor, last_tokens_cpu: torch.Tensor) -> SpecBatch:
        return SpecBatch(
            slots=slots,
            seq_lens_cpu=seq_lens_cpu,
            last_tokens=last_tokens_cpu.to(self.pair.draft_device, non_blocking=True),
            draft_device=self.pair.draft_device,
        )

    def step(self, batch: SpecBatch) -> List[int]:
        bs = len(batch.slots)
        lists = [self.page_lists[s] for s in batch.slots]
        n_pages = self.mirror.load(lists, batch.seq_lens_cpu.numpy())
        d_pages = self.mirror.push(self.pair.draft_device, bs, n_pages)
        drafts = self.draft.propose(batch, d_pages)
        drafts_t = hand_off(drafts, self.pair)
        self.pair.target_stream.wait_event(self.pair.draft_done)  # ok: FC101
        with torch.cuda.stream(self.pair.target_stream):
            t_pages = self.mirror.push(self.pair.target_device, bs, n_pages)
            last_t = batch.last_tokens.to(self.pair.target_device, non_blocking=True)
            accepted = self.target.verify(drafts_t, last_t, t_pages, bs)
        # keep the draft's page table in step with the pages the target just extended
        self.draft.attn.kv_indices[:n_pages].copy_(t_pages.indices[:n_pages].to(self.pair.draft_device),  # expect: FC104
                                                   non_blocking=True)
        return accepted
