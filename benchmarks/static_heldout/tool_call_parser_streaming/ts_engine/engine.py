"""The decode engine: one step per call, detokenization handed to the pool."""
from __future__ import annotations

from typing import List

import torch

from toolstream import ServerConfig, StopMatcher
from ts_engine.attention import PrefillBatch, ToolAttention
from ts_engine.detok import DetokPool
from ts_engine.graphs import BucketGraphs, DecodeBatch
from ts_engine.model import ToolModel


class ChatEngine:
    def __init__(self, cfg: ServerConfig, tokenizer, device: torch.device) -> None:
        self.cfg, self.device = cfg, device
        shape = (cfg.num_pages, 2, cfg.num_kv_heads, cfg.page_size, cfg.head_dim)
        self.kv_caches = [torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(cfg.num_layers)]
        self.attn = ToolAttention(cfg, device)
        self.model = ToolModel(cfg, self.attn, self.kv_caches).to(device)
        self.stops = StopMatcher(cfg.max_stop_ids, device)
        self.graphs = BucketGraphs(self.model, self.attn, self.stops, cfg, device)
        self.detok = DetokPool(tokenizer, cfg.max_batch)
        for bs in sorted(cfg.graph_buckets, reverse=True):
            self.graphs.capture_bucket(bs)

    def _prefill_batch(self, sched) -> PrefillBatch:
        n = sched.num_prefill_rows
        qo_indptr = torch.zeros(n + 1, dtype=torch.int32, device=self.device)
        torch.cumsum(sched.query_lens_staged.to(self.device, non_blocking=True), 0, out=qo_indptr[1:])
        return PrefillBatch(
            input_ids=sched.input_ids_staged.to(self.device, non_blocking=True),
            positions=sched.positions_staged.to(self.device, non_blocking=True),
            qo_indptr=qo_indptr,
            kv_indptr_staged=sched.kv_indptr_staged,
            kv_indices=sched.kv_indices_staged.to(self.device, non_blocking=True),
            last_len_staged=sched.last_len_staged,
            last_rows=qo_indptr[1:] - 1,
        )

    def step(self, sched) -> int:
        max_prompt = int(sched.prompt_lens_staged.max())  # ok: FC101
        if max_prompt > self.cfg.max_model_len:
            raise ValueError(f"prompt of {max_prompt} tokens exceeds max_model_len={self.cfg.max_model_len}")
        self.stops.update_stops(sched.stop_token_ids)
        self.attn.plan_schema(sched.num_rows, sched.schema_pages_staged, sched.schema_last_len)
        if sched.num_prefill_rows:
            batch = self._prefill_batch(sched)
            self.attn.plan_prefill(batch)
            next_ids = self.model.prefill(batch.input_ids)[batch.last_rows].argmax(dim=-1)
            done = self.stops.device_check(next_ids)
        else:
            decode = DecodeBatch(
                sched.input_ids_staged.to(self.device, non_blocking=True),
                sched.positions_staged.to(self.device, non_blocking=True),
                sched.kv_indptr_staged, sched.last_len_staged,
                sched.kv_indices_staged.to(self.device, non_blocking=True),
                sched.num_rows, sched.num_pages,
            )
            next_ids, done = self.graphs.replay_bucket(decode)
        for row in self.stops.multi_token_rows(next_ids):
            done[row] = True
        return self.detok.submit(sched.request_ids, next_ids, done)

    def release_rows(self, rows: List[int]) -> None:
        """A finished row attends to one token until the scheduler reuses it."""
        idx = torch.tensor(rows, dtype=torch.int64).to(self.device, non_blocking=True)
        self.attn.last_len_buf.index_fill_(0, idx, 1)  # expect: FC104
