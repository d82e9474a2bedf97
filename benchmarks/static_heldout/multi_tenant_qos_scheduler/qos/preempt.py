"""Preemption of low-priority requests: their KV pages are swapped to pinned host memory."""

import logging
from typing import Dict, List

import torch

from qos.requests import Request, RequestState

logger = logging.getLogger(__name__)


class PreemptionManager:
    def __init__(self, kv_caches: List[torch.Tensor], graph_indices: torch.Tensor, max_pages_per_req: int):
        self.kv_caches = kv_caches
        # the graph wrappers' shared indices: a swapped request must not leave its pages there
        self.graph_indices = graph_indices
        self.max_pages_per_req = max_pages_per_req
        self.swap_stream = torch.cuda.Stream()
        self._backend = "pinned-host"  # ok: FC103
        self._pending: Dict[str, torch.cuda.Event] = {}

    def _check_rows(self, rows: range) -> None:
        assert 0 <= rows.start and len(rows) <= self.max_pages_per_req, "row range out of bounds"  # expect: FC109

    def swap_out(self, req: Request, row_range: range) -> List[int]:
        self._check_rows(row_range)
        idx = torch.tensor(req.pages, dtype=torch.long)
        layers = []
        with torch.cuda.stream(self.swap_stream):
            for kv in self.kv_caches:
                host = torch.empty((len(req.pages),) + tuple(kv.shape[1:]), dtype=kv.dtype, pin_memory=True)
                host.copy_(kv[idx.to(kv.device, non_blocking=True)], non_blocking=True)
                layers.append(host)
            done = torch.cuda.Event()
            done.record(self.swap_stream)
        self._pending[req.request_id] = done
        req.host_kv = torch.stack(layers) if layers else None
        req.state = RequestState.SWAPPED
        # drop the request's rows from the captured graphs' page list right away
        self.graph_indices[row_range.start : row_range.stop].fill_(0)  # expect: FC104
        freed, req.pages = req.pages, []
        return freed

    def swap_in(self, req: Request, pages: List[int]) -> None:
        if req.host_kv is None:
            raise ValueError(f"{req.request_id} has no swapped KV")
        evt = self._pending.pop(req.request_id, None)
        if evt is not None:
            evt.synchronize()
        idx = torch.tensor(pages, dtype=torch.long)
        with torch.cuda.stream(self.swap_stream):
            for layer, kv in enumerate(self.kv_caches):
                kv[idx.to(kv.device, non_blocking=True)] = req.host_kv[layer].to(kv.device, non_blocking=True)
        self.swap_stream.synchronize()  # ok: FC101
        req.pages = pages
        req.host_kv = None
        req.state = RequestState.RUNNING

    def pending(self) -> int:
        assert all(isinstance(e, torch.cuda.Event) for e in self._pending.values())  # ok: FC109
        return len(self._pending)
