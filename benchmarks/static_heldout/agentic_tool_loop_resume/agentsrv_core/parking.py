"""Parking of requests that wait on a tool call.

A paused request leaves the decode batch but keeps its pages; after
``park_to_host_after_s`` without a tool result its pages are copied to pinned
host memory and released, and brought back on resume.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Dict, List, Optional

import torch

from agentsrv.requests import AgentRequest, ReqState
from agentsrv.settings import AgentSettings

if TYPE_CHECKING:
    from agentsrv_core.attention import AgentAttention


def _scrub_rows(indices: torch.Tensor, start: int, end: int) -> None:
    indices[start:end] = 0


class ParkingLot:
    def __init__(self, settings: AgentSettings, attn: "AgentAttention", kv_cache: List[torch.Tensor]):
        self.s = settings
        self.attn = attn
        self.kv_cache = kv_cache
        self._backend = "pinned-host"  # ok: FC103
        self.parked: Dict[str, AgentRequest] = {}
        self.host_pages: Dict[str, torch.Tensor] = {}
        self.staging_host: Optional[torch.Tensor] = None
        self.num_parked_pages = 0
        self.free_pages: List[int] = []

    def park(self, req: AgentRequest, row: int) -> None:
        req.state = ReqState.AWAITING_TOOL
        req.parked_at = time.monotonic()
        self.parked[req.rid] = req
        self.num_parked_pages += len(req.pages)
        # the request leaves the decode batch: drop its row's page ids from the graph's table
        start = int(self.attn.kv_indptr_host[row])
        end = int(self.attn.kv_indptr_host[row + 1])
        _scrub_rows(self.attn.kv_indices, start, end)  # expect: FC104
        self._check_pages()

    def offload_idle(self, now: float) -> None:
        for rid, req in list(self.parked.items()):
            if req.on_host or now - req.parked_at < self.s.park_to_host_after_s:
                continue
            pages = torch.tensor(req.pages, dtype=torch.int64, device=self.kv_cache[0].device)
            n = len(req.pages)
            self.staging_host = torch.empty((len(self.kv_cache), n) + tuple(self.kv_cache[0].shape[1:]), dtype=self.kv_cache[0].dtype, pin_memory=True)  # ok: FC107
            for layer, buf in enumerate(self.kv_cache):
                self.staging_host[layer].copy_(buf.index_select(0, pages), non_blocking=True)
            self.host_pages[rid] = self.staging_host
            self.free_pages.extend(req.pages)
            self.num_parked_pages -= n
            req.pages = []
            req.on_host = True
            self._check_pages()

    def unpark(self, rid: str, alloc) -> AgentRequest:
        req = self.parked.pop(rid)
        if req.on_host:
            host = self.host_pages.pop(rid)
            req.pages = alloc(host.shape[1])
            pages = torch.tensor(req.pages, dtype=torch.int64, device=self.kv_cache[0].device)
            for layer, buf in enumerate(self.kv_cache):
                buf.index_copy_(0, pages, host[layer].to(buf.device, non_blocking=True))
            req.on_host = False
        else:
            self.num_parked_pages -= len(req.pages)
        req.state = ReqState.RESUMING
        self._check_pages()
        return req

    def pages_in_graph(self, bs: int) -> torch.Tensor:
        """Debug helper: the page ids the bucket's captured graph currently reads."""
        w = self.attn.graph_wrappers[bs]
        return w._paged_kv_indices_buf  # expect: FC103

    def _check_pages(self) -> None:
        on_device = sum(len(r.pages) for r in self.parked.values() if not r.on_host)
        assert self.num_parked_pages == on_device, "parked page accounting drifted"  # ok: FC109
