"""Ships finished prompts' KV pages from the prefill GPU to the decode GPU (peer copies on copy streams)."""
from __future__ import annotations

import collections
import queue
from dataclasses import dataclass
from typing import TYPE_CHECKING, Deque, List

import torch

from hgs.config import ClusterConfig
from hgs.devices import DeviceContext
from hgs.model import HeteroLM

if TYPE_CHECKING:
    from hgs_decode.attention import DecodeAttention


@dataclass
class Arrival:
    req_id: int
    page_ids: List[int]
    prompt_len: int
    first_token: int
    ready: torch.cuda.Event


def _scatter_rows(dst: torch.Tensor, rows: torch.Tensor, values: torch.Tensor) -> None:
    dst.index_copy_(0, rows, values)


class KVReceiver:
    def __init__(self, cfg: ClusterConfig, attn: "DecodeAttention", ctx: DeviceContext):
        self.cfg = cfg
        self.attn = attn
        self.ctx = ctx
        self.max_pages_per_req = cfg.max_pages_per_seq
        self.free_pages: Deque[int] = collections.deque(range(1, cfg.decode_pages))
        self.free_mask = torch.zeros(cfg.decode_pages, dtype=torch.bool, device=ctx.device)
        self.staged_tail = 0
        self.landed: "queue.Queue[Arrival]" = queue.Queue()

    def reserve(self, num_pages: int) -> List[int]:
        if num_pages > len(self.free_pages):
            raise RuntimeError(f"decode pool exhausted: need {num_pages}, {len(self.free_pages)} free")
        return [self.free_pages.popleft() for _ in range(num_pages)]

    def on_pages_landed(self, req_id: int, page_ids: List[int], prompt_len: int, first_token: int, ready) -> None:
        assert len(page_ids) <= self.max_pages_per_req, "manifest larger than a decode row"  # expect: FC109
        # pre-stage the pages behind the live rows of the graph's page table so admission skips a copy
        start = self.staged_tail
        rows = torch.arange(start, start + len(page_ids), device=self.ctx.device)
        values = torch.tensor(page_ids, dtype=torch.int32, device=self.ctx.device)
        _scatter_rows(self.attn.indices_buf, rows, values)  # expect: FC104
        self.staged_tail += len(page_ids)
        self.landed.put(Arrival(req_id, page_ids, prompt_len, first_token, ready))

    def release_pages(self, pages: torch.Tensor, page_list: List[int]) -> None:
        self.free_mask[pages] = True
        self.free_pages.extend(page_list)


class KVSender:
    def __init__(self, src: HeteroLM, dst: HeteroLM, src_ctx: DeviceContext, receiver: KVReceiver):
        self.src = src
        self.dst = dst
        self.src_ctx = src_ctx
        self.receiver = receiver

    def send(self, req_id: int, src_pages: List[int], prompt_len: int, first_token: int) -> None:
        dst_pages = self.receiver.reserve(len(src_pages))
        dst_dev = self.receiver.ctx.device
        src_idx = torch.tensor(src_pages, dtype=torch.int64, device=self.src_ctx.device)
        dst_idx = torch.tensor(dst_pages, dtype=torch.int64, device=dst_dev)
        ready = torch.cuda.Event()
        with torch.cuda.stream(self.src_ctx.copy_stream):
            self.src_ctx.copy_stream.wait_stream(self.src_ctx.compute_stream)
            for (sk, sv), (dk, dv) in zip(self.src.kv, self.dst.kv):
                dk.index_copy_(0, dst_idx, sk.index_select(0, src_idx).to(dst_dev, non_blocking=True))
                dv.index_copy_(0, dst_idx, sv.index_select(0, src_idx).to(dst_dev, non_blocking=True))
            ready.record(self.src_ctx.copy_stream)
        self.receiver.on_pages_landed(req_id, dst_pages, prompt_len, first_token, ready)
