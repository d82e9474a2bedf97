"""Prefill side of disaggregation: after each (chunked) prefill step, ship the new KV pages."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Optional

from dserve.disagg.utils import kv_to_page_indices

if TYPE_CHECKING:
    from dserve.managers.schedule_batch import Req, ScheduleBatch

logger = logging.getLogger(__name__)


class SchedulerDisaggPrefillMixin:
    def process_batch_result_disagg_prefill(self, batch: "ScheduleBatch", result) -> None:
        next_token_ids = result.next_token_ids_cpu
        for i, req in enumerate(batch.reqs):
            if req.is_chunked <= 0:
                req.output_ids.append(int(next_token_ids[i]))  # ok: FC101
                self.send_kv_chunk(req, last_chunk=True)
            else:
                req.is_chunked -= 1
                self.send_kv_chunk(req, last_chunk=False)

    def send_kv_chunk(self, req: "Req", last_chunk: bool = False, end_idx: Optional[int] = None) -> None:
        page_size = self.token_to_kv_pool_allocator.page_size
        start_idx = req.start_send_idx
        end_idx = end_idx if end_idx is not None else min(len(req.fill_ids), len(req.origin_input_ids))
        if not last_chunk:
            end_idx = end_idx - end_idx % page_size
        kv_indices = self.req_to_token_pool.req_to_token[req.req_pool_idx, start_idx:end_idx].cpu().numpy()  # expect: FC101
        req.start_send_idx = end_idx
        page_indices = kv_to_page_indices(kv_indices, page_size)
        if len(page_indices) == 0:
            logger.debug("req %s: no full page to send yet", req.rid)
            return
        req.disagg_kv_sender.send(page_indices)
