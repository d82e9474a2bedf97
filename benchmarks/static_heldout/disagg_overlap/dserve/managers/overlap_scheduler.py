"""Overlap scheduler: launch batch N+1 on the forward stream while batch N's results are processed."""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from typing import Deque, Optional, Tuple

import torch

from dserve.disagg.prefill import SchedulerDisaggPrefillMixin
from dserve.managers.future_map import FutureMap
from dserve.managers.schedule_batch import ReqToTokenPool, ScheduleBatch

logger = logging.getLogger(__name__)


@dataclass
class GenerationBatchResult:
    logits_output: Optional[torch.Tensor]
    next_token_ids: torch.Tensor
    next_token_ids_cpu: Optional[torch.Tensor] = None
    copy_done: Optional[torch.cuda.Event] = None
    bid: int = 0


class OverlapScheduler(SchedulerDisaggPrefillMixin):
    def __init__(self, server_args, model_runner, token_to_kv_pool_allocator, device: str = "cuda"):
        self.server_args = server_args
        self.model_runner = model_runner
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self.req_to_token_pool = ReqToTokenPool(server_args.max_running_requests, server_args.context_len, device)
        self.forward_stream = torch.cuda.Stream()
        self.future_map = FutureMap(server_args.max_running_requests, torch.device(device))
        self.next_token_ids_pinned = torch.empty((server_args.max_running_requests,), dtype=torch.int64, pin_memory=True)
        self.result_queue: Deque[Tuple[ScheduleBatch, GenerationBatchResult]] = deque()
        self.last_batch: Optional[ScheduleBatch] = None
        self.disaggregation_mode = server_args.disaggregation_mode

    def run_batch(self, batch: ScheduleBatch) -> GenerationBatchResult:
        bs = batch.batch_size()
        self.future_map.resolve_future(batch.input_ids)
        future_indices = self.future_map.alloc_future_indices(bs)
        with torch.cuda.stream(self.forward_stream):
            self.forward_stream.wait_stream(torch.cuda.current_stream())
            logits, next_token_ids = self.model_runner.forward_and_sample(batch)
            self.future_map.store_to_map(future_indices, next_token_ids)
            copy_done = torch.cuda.Event()
            self.next_token_ids_pinned[:bs].copy_(next_token_ids, non_blocking=True)
            copy_done.record()
        if batch.return_logprob:
            # logprobs are gathered on the host; wait for the forward to finish first
            self.forward_stream.synchronize()  # expect: FC101
            batch.logprob_cpu = torch.log_softmax(logits.float(), dim=-1).to("cpu", non_blocking=True)
        return GenerationBatchResult(
            logits_output=logits,
            next_token_ids=-future_indices,
            next_token_ids_cpu=self.next_token_ids_pinned[:bs],
            copy_done=copy_done,
            bid=batch.bid,
        )

    def process_batch_result(self, batch: ScheduleBatch, result: GenerationBatchResult) -> None:
        result.copy_done.synchronize()  # ok: FC101
        next_token_ids = result.next_token_ids_cpu.tolist()  # ok: FC101
        if self.disaggregation_mode == "prefill":
            self.process_batch_result_disagg_prefill(batch, result)
            return
        for req, tok in zip(batch.reqs, next_token_ids):
            req.output_ids.append(tok)

    def get_next_batch_to_run(self) -> Optional[ScheduleBatch]:
        return None

    def event_loop_overlap(self) -> None:
        while True:
            batch = self.get_next_batch_to_run()
            if batch is not None:
                result = self.run_batch(batch)
                self.result_queue.append((batch.copy(), result))
            if self.last_batch is not None and self.result_queue:
                tmp_batch, tmp_result = self.result_queue.popleft()
                self.process_batch_result(tmp_batch, tmp_result)
            self.last_batch = batch
