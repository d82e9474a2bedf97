"""Long-context server: each step decodes every band's sub-batch."""
from __future__ import annotations

import logging
from typing import Dict, List, Optional

import numpy as np
import torch

from yarnserve.attn.chunked import ChunkedPrefillPlanner, PromptJob
from yarnserve.attn.decode import BandDecodeAttention
from yarnserve.bands import BandTable
from yarnserve.kv_pool import PagedKVPool
from yarnserve.rope.cache import BandRopeCache
from yarnserve.settings import ServeSettings
from yarn_engine.batch import DecodeBatch, Request
from yarn_engine.graphs import BandGraphRunner
from yarn_engine.model import YarnLM

logger = logging.getLogger(__name__)


class LongContextServer:
    def __init__(self, settings: Optional[ServeSettings] = None, device: str = "cuda") -> None:
        self.settings = settings or ServeSettings()
        self.device = torch.device(device)
        s = self.settings
        self.table = BandTable.default(s.original_max_position)
        self.pool = PagedKVPool(s, self.device)
        self.rope = BandRopeCache(self.table, s, self.device)
        self.attn = BandDecodeAttention(s, self.table, self.pool, self.device)
        self.planner = ChunkedPrefillPlanner(s, self.table, self.pool, self.attn, self.device)
        self.model = YarnLM(s, self.attn, self.rope).to(self.device)
        self.graphs = BandGraphRunner(self.model, self.attn, self.table, s, self.device)
        self.running: List[Request] = []
        self.spilled: List[torch.Tensor] = []
        self.next_tokens: Optional[torch.Tensor] = None

    def admit(self, row: int, prompt_len: int) -> None:
        band = int(self.table.band_of_lengths(np.array([prompt_len]))[0])
        self.planner.submit(PromptJob(row=row, length=prompt_len, band_index=min(band, len(self.table) - 1)))

    def step(self) -> Dict[int, int]:
        if self.planner.has_pending():
            self.planner.next_chunk()
        reqs = self.running
        if not reqs:
            return {}
        lens_np = np.array([r.seq_len for r in reqs], dtype=np.int64)
        bands_used = self.table.band_of_lengths(lens_np).tolist()  # ok: FC101
        if self.next_tokens is None:
            self.next_tokens = torch.empty(self.settings.max_batch, dtype=torch.int64, device=self.device)  # ok: FC107
        result: Dict[int, int] = {}
        for b in sorted(set(bands_used)):
            sel = [i for i, x in enumerate(bands_used) if x == b]
            sub = DecodeBatch.build([reqs[i] for i in sel], b, self.settings.far_split, self.device)
            if b >= len(self.table):
                raise ValueError(f"no RoPE band covers seq_lens={sub.seq_lens}")  # ok: FC101
            band = self.table[b]
            longest = sub.seq_lens.max().item()  # expect: FC101
            self.rope.ensure(b, longest + 1)
            if self.rope._backend == "triton":  # ok: FC103
                self.rope.warm(b)
            # requests that will cross into the next band after this token
            crossing = sub.req_ids[sub.seq_lens >= band.max_len]  # expect: FC101
            self.spilled.append(crossing)
            if self.graphs.can_replay(b, sub.size):
                logits = self.graphs.replay_band(band, sub)
            elif sub.size > self.settings.max_batch:
                self.attn.plan_long(sub)
                logits = self.model.decode_long(sub.input_ids, sub.positions, b, sub)
            else:
                self.attn.plan_eager(band, sub)
                logits = self.model.decode(sub.input_ids, sub.positions, b, sub)
            self.next_tokens[: sub.size].copy_(logits.argmax(-1))
            for j, i in enumerate(sel):
                reqs[i].seq_len += 1
                result[reqs[i].req_id] = j
        return result
