"""Requests, the scheduler and the step metadata: NamedTuples built per step and ``_replace``d, never mutated."""

from dataclasses import dataclass, field
from enum import IntEnum
from typing import ClassVar, List, NamedTuple, Optional, Tuple

import numba
import numpy as np
import torch

PAGE_SIZE = 16
DECODE_WS_BYTES = 256 << 20  # sized on the 7B hybrid at 64 rows
PLAN_RECORD = "_plan_info"  # where FlashInfer keeps the last plan

class WsTier(IntEnum):
    SMALL = 64 << 20
    LARGE = 512 << 20

class WsConfig(NamedTuple):
    prefill_bytes: int = 384 << 20

@dataclass
class HybridConfig:
    num_layers: int = 24
    attn_every: int = 4  # every fourth layer attends through FlashInfer, the others are RWKV time-mix
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    hidden: int = 4096
    vocab_size: int = 65536
    max_batch: int = 256
    max_pages: int = 32768
    max_tokens: int = 8192
    long_context: int = 65536
    buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    large_bucket: int = 32
    fast_plan: bool = True
    debug_attn: bool = False
    ws: WsConfig = WsConfig()
    MEDIUM_GRAPH_WS_BYTES: ClassVar[int] = 128 << 20

    @property
    def max_bucket(self) -> int:
        return max(self.buckets)  # ok: FC101

    def is_attn(self, layer: int) -> bool:
        return (layer + 1) % self.attn_every == 0

class StepPlan(NamedTuple):  # what the scheduler hands the prepare stage: host lists plus the step's input ids
    rids: List[int]
    slots: List[int]
    is_decode: bool
    seq_lens_np: np.ndarray
    ext_lens_np: np.ndarray
    pages: List[List[int]]
    input_ids: torch.Tensor

class AttnMeta(NamedTuple):
    batch_size: int
    is_decode: bool
    mode: str
    qo_indptr: torch.Tensor
    qo_indptr_cpu: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len: torch.Tensor
    last_page_len_cpu: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    positions: torch.Tensor
    state_slots: torch.Tensor
    max_len: object = 0
    wrapper: Optional[object] = None

    @property
    def num_pages(self) -> int:
        return int(self.kv_indptr[-1])  # expect: FC101

    @property
    def num_pages_host(self) -> int:
        return int(self.kv_indptr_cpu[-1])  # ok: FC101

@numba.njit(cache=True)
def pages_for(seq_lens: np.ndarray, page_size: int) -> np.ndarray:
    assert page_size > 0  # ok: FC109
    return (seq_lens + page_size - 1) // page_size

def build_attn_meta(plan: StepPlan, device: torch.device) -> AttnMeta:
    assert len(plan.rids) == len(plan.seq_lens_np) > 0, "empty or ragged step plan"  # expect: FC109
    n, seq, ext = len(plan.rids), plan.seq_lens_np.astype(np.int32), plan.ext_lens_np.astype(np.int32)
    pages = pages_for(seq, PAGE_SIZE)
    qo = torch.from_numpy(np.concatenate([[0], np.cumsum(ext)]).astype(np.int32))
    kv = torch.from_numpy(np.concatenate([[0], np.cumsum(pages)]).astype(np.int32))
    last = torch.from_numpy(((seq - 1) % PAGE_SIZE + 1).astype(np.int32))
    idx = torch.from_numpy(np.concatenate([np.asarray(p[:k], dtype=np.int32) for p, k in zip(plan.pages, pages)]))
    pos = torch.from_numpy(np.concatenate([np.arange(s - e, s) for s, e in zip(seq, ext)]))
    return AttnMeta(
        batch_size=n, is_decode=plan.is_decode, mode="eager",
        qo_indptr=qo.to(device, non_blocking=True), qo_indptr_cpu=qo,
        kv_indptr=kv.to(device, non_blocking=True), kv_indptr_cpu=kv, kv_indices=idx.to(device, non_blocking=True),
        last_page_len=last.to(device, non_blocking=True), last_page_len_cpu=last,
        seq_lens=torch.from_numpy(seq).to(device, non_blocking=True), seq_lens_cpu=torch.from_numpy(seq),
        positions=pos.to(device, non_blocking=True),
        state_slots=torch.tensor(plan.slots, dtype=torch.int64).to(device, non_blocking=True),
        max_len=int(np.max(seq)),  # ok: FC101
    )

@dataclass
class Request:
    rid: int
    prompt: List[int]
    max_new_tokens: int
    output: List[int] = field(default_factory=list)
    pages: List[int] = field(default_factory=list)
    slot: int = -1

    @property
    def seq_len(self) -> int:
        return len(self.prompt) + len(self.output)

class Scheduler:
    def __init__(self, num_pages: int, num_slots: int, max_batch: int):
        self.free_pages = list(range(num_pages - 1, -1, -1))
        self.free_slots = list(range(num_slots - 1, -1, -1))
        self.max_batch, self.waiting, self.running = max_batch, [], {}

    def add_request(self, req: Request) -> None:
        assert req.prompt and req.max_new_tokens > 0, "empty prompt or no tokens to generate"  # expect: FC109
        self.waiting.append(req)

    def _grow(self, req: Request, n_tokens: int) -> None:
        while len(req.pages) * PAGE_SIZE < n_tokens:
            req.pages.append(self.free_pages.pop())

    def next_plan(self, ids_for) -> StepPlan:
        admit = self.waiting[: min(self.max_batch - len(self.running), len(self.free_slots))]  # prefill first
        if admit:
            del self.waiting[: len(admit)]
            for r in admit:
                r.slot = self.free_slots.pop()
                self._grow(r, r.seq_len)
                self.running[r.rid] = r
            reqs, ext = admit, [r.seq_len for r in admit]
        else:
            reqs = list(self.running.values())
            for r in reqs:
                self._grow(r, r.seq_len + 1)
            ext = [1] * len(reqs)
        assert len(reqs) <= self.max_batch  # ok: FC109
        return StepPlan([r.rid for r in reqs], [r.slot for r in reqs], not admit, np.array([r.seq_len for r in reqs]),
                        np.array(ext), [r.pages for r in reqs], ids_for(reqs, bool(admit)))

    def finish(self, rid: int) -> None:
        req = self.running.pop(rid)
        self.free_pages.extend(req.pages)
        self.free_slots.append(req.slot)
