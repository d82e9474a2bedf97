"""The engine: eager calibration steps, then graph replays with frozen scales."""
from __future__ import annotations

import logging
from typing import Dict, List

import torch

from fp8cal.attn.backend import Fp8DecodeBackend
from fp8cal.batch import DecodeBatch, PrefillBatch
from fp8cal.calib.freeze import ScaleFreezer
from fp8cal.calib.observer import AmaxObserver
from fp8cal.kv.cache import Fp8PagedKVCache
from fp8cal.settings import CalibSettings
from fp8cal_rt.graphs import Fp8GraphRunner
from fp8cal_rt.model import Fp8Model

logger = logging.getLogger(__name__)


class CalibratingEngine:
    def __init__(self, s: CalibSettings, device: str = "cuda"):
        self.s = s
        self.device = torch.device(device)
        self.cache = Fp8PagedKVCache(s, self.device)
        self.observer = AmaxObserver(s.num_layers, s.calib_steps, self.device)
        self.backend = Fp8DecodeBackend(s, self.cache, self.device)
        self.model = Fp8Model(s, self.backend, self.cache, self.observer).to(self.device)
        self.freezer = ScaleFreezer(s, self.cache, self.observer, self.backend, self.device)
        self.graphs = Fp8GraphRunner(s, self.model, self.backend, self.cache, self.device)
        self.frozen = False
        self.step_id = 0
        self.pages: Dict[int, List[int]] = {}
        self.lens: Dict[int, int] = {}
        self.last_token: Dict[int, int] = {}
        self.free_pages: List[int] = list(range(s.max_pages - 1, -1, -1))
        self._out_loc_cpu = torch.zeros(s.max_batch_size, dtype=torch.long, pin_memory=True)

    # -- host bookkeeping --------------------------------------------------------------------

    def _reserve_slot(self, rid: int) -> int:
        P = self.s.page_size
        if self.lens[rid] % P == 0:
            self.pages[rid].append(self.free_pages.pop())
        slot = self.pages[rid][-1] * P + self.lens[rid] % P
        self.lens[rid] += 1
        return slot

    def _decode_batch(self) -> DecodeBatch:
        rids = sorted(self.lens)
        P = self.s.page_size
        slots = [self._reserve_slot(rid) for rid in rids]
        indptr = [0]
        for rid in rids:
            indptr.append(indptr[-1] + len(self.pages[rid]))
        width = max(len(self.pages[rid]) for rid in rids)
        tables = [self.pages[rid] + [0] * (width - len(self.pages[rid])) for rid in rids]
        bs = len(rids)
        self._out_loc_cpu[:bs].copy_(torch.tensor(slots, dtype=torch.long))
        return DecodeBatch(
            num_rows=bs,
            rids=rids,
            input_ids=torch.tensor([self.last_token[r] for r in rids], dtype=torch.long, device=self.device),
            positions=torch.tensor([self.lens[r] - 1 for r in rids], dtype=torch.long, device=self.device),
            kv_indices=torch.tensor([p for r in rids for p in self.pages[r]], dtype=torch.int32, device=self.device),
            block_tables=torch.tensor(tables, dtype=torch.int32, device=self.device),
            seq_lens=torch.tensor([self.lens[r] for r in rids], dtype=torch.int32, device=self.device),
            kv_indptr_cpu=torch.tensor(indptr, dtype=torch.int32).pin_memory(),
            last_page_len_cpu=torch.tensor([(self.lens[r] - 1) % P + 1 for r in rids], dtype=torch.int32).pin_memory(),
            indptr_list=indptr,
            max_seq_len=max(self.lens[r] for r in rids),
            page_lists=[self.pages[r] for r in rids],
        )

    # -- prompts -----------------------------------------------------------------------------

    def prefill(self, prompts: Dict[int, List[int]]) -> torch.Tensor:
        rids = list(prompts)
        cu = [0]
        slots: List[int] = []
        for rid in rids:
            self.pages[rid] = []
            self.lens[rid] = 0
            for _ in prompts[rid]:
                slots.append(self._reserve_slot(rid))
            cu.append(cu[-1] + len(prompts[rid]))
        pb = PrefillBatch(
            num_rows=len(rids),
            input_ids=torch.tensor([t for r in rids for t in prompts[r]], dtype=torch.long, device=self.device),
            positions=torch.tensor([i for r in rids for i in range(len(prompts[r]))], dtype=torch.long, device=self.device),
            cu_seqlens_q_cpu=torch.tensor(cu, dtype=torch.int32),
            cu_seqlens_k=torch.tensor(cu, dtype=torch.int32, device=self.device),
            out_loc=torch.tensor(slots, dtype=torch.long, device=self.device),
        )
        self.backend.plan_prompt(pb)
        logits = self.model.prefill(pb.input_ids, pb.positions, pb.out_loc)
        ends = torch.tensor([c - 1 for c in cu[1:]], dtype=torch.long, device=self.device)
        return torch.argmax(logits.index_select(0, ends), dim=-1)

    # -- decode ------------------------------------------------------------------------------

    def step(self) -> torch.Tensor:
        batch = self._decode_batch()
        bs = batch.num_rows
        self.cache.out_loc[:bs].copy_(self._out_loc_cpu[:bs], non_blocking=True)
        if not self.frozen:
            self.backend.plan_eager_step(batch)
            logits = self.model.decode_eager(batch.input_ids, batch.positions, bs)
            self.observer.observe()
            if self.observer.steps_seen >= self.s.calib_steps:
                self.freezer.freeze(batch.page_lists)
                self.frozen = True
                logger.info("froze FP8 KV scales at step %d (layer 0 K scale %.5f)", self.step_id, float(self.cache.k_scale[0]))  # expect: FC101
        else:
            padded = self.graphs.bucket_for(bs)
            if padded is None or padded not in self.graphs.graphs:
                self.backend.plan_eager_step(batch)
                logits = self.model.decode_eager(batch.input_ids, batch.positions, bs)
            else:
                self.backend.stage_replay(batch, padded)
                self.freezer.maybe_refreeze(batch.page_lists)
                logits = self.graphs.replay_bucket(batch, padded)
            self.observer.observe()
        self.step_id += 1
        return torch.argmax(logits, dim=-1)

    def serve_forever(self, requests) -> None:
        for rid, tok in zip(requests, self.prefill(requests).tolist()):
            self.last_token[rid] = tok
        while self.lens:
            if self.frozen and not self.graphs.graphs:
                self.graphs.capture_all()
            next_ids = self.step().tolist()
            for rid, tok in zip(sorted(self.lens), next_ids):
                self.last_token[rid] = tok
