"""The scheduler loop: radix-cache matching, admission under a token budget, eviction with
lock refs, and a periodic compaction of the token pool."""

from __future__ import annotations

import logging
from typing import List, Optional

import torch

import flashcheck
from flashcheck import hot_path
from tok_srt.forward_batch import ForwardMode
from tok_srt.model_runner import ModelRunner, ServerArgs
from tok_srt.schedule_batch import Req, ScheduleBatch
from tokpool.global_config import global_config
from tokpool.radix_cache import RadixCache

logger = logging.getLogger(__name__)


class Scheduler:
    def __init__(self, server_args: ServerArgs, model_runner: ModelRunner):
        self.server_args = server_args
        self.model_runner = model_runner
        self.device = model_runner.device
        self.req_to_token_pool = model_runner.req_to_token_pool
        self.token_to_kv_pool = model_runner.token_to_kv_pool
        self.attn_backend = model_runner.attn_backend
        self.tree_cache = RadixCache(self.req_to_token_pool, self.token_to_kv_pool)
        self.waiting_queue: List[Req] = []
        self.running_batch: Optional[ScheduleBatch] = None
        self.max_prefill_tokens = server_args.chunked_prefill_size
        self.eos_token_id = server_args.eos_token_id
        self.step_count = 0

    def add_request(self, req: Req) -> None:
        self.waiting_queue.append(req)

    @flashcheck.hot_path
    def get_next_batch_to_run(self) -> Optional[ScheduleBatch]:
        new_batch = self.get_new_batch_prefill()
        if new_batch is not None:
            return new_batch
        if self.running_batch is None:
            return None
        self.step_count += 1
        if self.step_count % global_config.defrag_interval == 0 and self._fragmented():
            self._defragment_kv()
        self.running_batch.forward_batch = self.running_batch.prepare_for_decode()
        return self.running_batch

    def get_new_batch_prefill(self) -> Optional[ScheduleBatch]:
        if not self.waiting_queue:
            return None
        budget = self.max_prefill_tokens
        can_run: List[Req] = []
        for req in self.waiting_queue:
            req.init_next_round_input(self.tree_cache)
            logger.debug("req %s matched prefix slots %s", req.rid, req.prefix_indices)  # ok: FC101
            if req.extend_input_len > budget:
                break
            self.tree_cache.inc_lock_ref(req.last_node)
            budget -= req.extend_input_len
            can_run.append(req)
        if not can_run:
            return None
        self.waiting_queue = self.waiting_queue[len(can_run) :]
        new_batch = ScheduleBatch(
            can_run, self.req_to_token_pool, self.token_to_kv_pool, self.tree_cache, self.attn_backend, self.device
        )
        new_batch.forward_batch = new_batch.prepare_for_extend()
        return new_batch

    @hot_path
    def process_batch_result(self, batch: ScheduleBatch, next_token_ids: List[int]) -> None:
        still_running = []
        for req, tok in zip(batch.reqs, next_token_ids):
            req.output_ids.append(tok)
            if tok == self.eos_token_id or len(req.output_ids) >= req.max_new_tokens:
                req.finished = True
                self.tree_cache.cache_finished_req(req)
            else:
                still_running.append(req)
        if self.running_batch is not None and batch is not self.running_batch:
            still_running = [r for r in self.running_batch.reqs if not r.finished] + still_running
        self.running_batch = (
            ScheduleBatch(
                still_running, self.req_to_token_pool, self.token_to_kv_pool, self.tree_cache, self.attn_backend, self.device
            )
            if still_running
            else None
        )

    def _fragmented(self) -> bool:
        free = self.token_to_kv_pool.available_size()
        return free < global_config.defrag_min_free_ratio * self.token_to_kv_pool.size

    def _defragment_kv(self) -> None:
        remap = self.token_to_kv_pool.compact()
        r2t = self.req_to_token_pool.req_to_token
        r2t.copy_(remap[r2t.long()].to(r2t.dtype))
        self.tree_cache.remap_values(remap)
        # keep the decode graphs' index buffer consistent with the new slot numbers too
        graph_idx = self.attn_backend.cuda_graph_kv_indices
        graph_idx.copy_(remap[graph_idx.long()].to(graph_idx.dtype))  # expect: FC104

    def run_batch(self, batch: ScheduleBatch) -> List[int]:
        fb = batch.forward_batch
        logits = self.model_runner.forward(fb)
        if fb.forward_mode == ForwardMode.EXTEND:
            last = torch.cumsum(fb.seq_lens - fb.extend_prefix_lens, 0) - 1
            logits = logits.index_select(0, last)
        return torch.argmax(logits, dim=-1).tolist()

    def event_loop(self) -> None:
        while True:
            batch = self.get_next_batch_to_run()
            if batch is None:
                continue
            self.process_batch_result(batch, self.run_batch(batch))
