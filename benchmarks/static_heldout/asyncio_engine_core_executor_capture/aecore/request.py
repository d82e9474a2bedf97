"""Requests, the host-side scheduler, the per-step batch it hands the model runner, and the runner's output."""
from collections import deque
from dataclasses import dataclass, field
from typing import Deque, Dict, List, Optional

import numpy as np
import torch

from aecore.config import PAGE_SIZE, EngineConfig


@dataclass
class Request:
    request_id: str
    prompt_ids: List[int]
    max_tokens: int = 256
    temperature: float = 0.0
    output_ids: List[int] = field(default_factory=list)
    pages: List[int] = field(default_factory=list)

    @property
    def seq_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)


@dataclass
class StepBatch:
    req_ids: List[str]
    num_reqs: int
    is_prefill: bool
    max_seq_len: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    temperature: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    block_tables: torch.Tensor
    seq_lens_cpu: torch.Tensor
    query_start_loc_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor


@dataclass
class ModelOutput:
    sampled_token_ids: torch.Tensor
    logprobs: torch.Tensor
    finished: torch.Tensor
    done_event: torch.cuda.Event
    num_reqs: int
    prompt_logprobs: Optional[List[float]] = None


@torch.jit.script
def last_page_lens(seq_lens: torch.Tensor, page_size: int) -> torch.Tensor:
    assert page_size > 0  # ok: FC109
    return (seq_lens - 1) % page_size + 1


def build_step_batch(reqs: List[Request], is_prefill: bool, device: torch.device) -> StepBatch:
    assert len(reqs) > 0  # expect: FC109
    seq_lens = np.array([r.seq_len for r in reqs], dtype=np.int32)
    toks = [r.prompt_ids if is_prefill else r.output_ids[-1:] for r in reqs]
    qsl, kv_indptr = np.zeros(len(reqs) + 1, dtype=np.int32), np.zeros(len(reqs) + 1, dtype=np.int32)
    np.cumsum([len(t) for t in toks], out=qsl[1:])
    pages = (seq_lens + PAGE_SIZE - 1) // PAGE_SIZE
    np.cumsum(pages, out=kv_indptr[1:])
    tables = np.zeros((len(reqs), int(pages.max())), dtype=np.int32)  # ok: FC101
    for i, (r, p) in enumerate(zip(reqs, pages)):
        tables[i, :p] = r.pages[:p]
    positions = np.concatenate([np.arange(s - len(t), s) for t, s in zip(toks, seq_lens)])
    last_cpu = last_page_lens(torch.from_numpy(seq_lens), PAGE_SIZE)

    def dev(a) -> torch.Tensor:
        return torch.from_numpy(np.asarray(a)).to(device, non_blocking=True)

    return StepBatch(
        [r.request_id for r in reqs], len(reqs), is_prefill, int(seq_lens.max()),
        dev(np.concatenate(toks).astype(np.int64)), dev(positions.astype(np.int64)),
        dev(np.array([r.temperature for r in reqs], dtype=np.float32)), dev(seq_lens), dev(qsl), dev(kv_indptr),
        dev(np.concatenate([tables[i, :p] for i, p in enumerate(pages)])), last_cpu.to(device, non_blocking=True),
        dev(tables), torch.from_numpy(seq_lens), torch.from_numpy(qsl), torch.from_numpy(kv_indptr), last_cpu)


class Scheduler:
    def __init__(self, cfg: EngineConfig, device: torch.device):
        self.cfg, self.device = cfg, device
        self.free_pages: Deque[int] = deque(range(cfg.num_pages))
        self.waiting: Deque[Request] = deque()
        self.running: Dict[str, Request] = {}

    def _alloc_pages(self, n: int) -> List[int]:
        assert n <= len(self.free_pages)  # ok: FC109
        return [self.free_pages.popleft() for _ in range(n)]

    def schedule(self) -> Optional[StepBatch]:
        admitted: List[Request] = []
        while self.waiting and len(self.running) + len(admitted) < self.cfg.max_num_seqs:
            req = self.waiting.popleft()
            req.pages = self._alloc_pages(-(-req.seq_len // PAGE_SIZE))
            admitted.append(req)
        self.running.update((r.request_id, r) for r in admitted)
        reqs = admitted or list(self.running.values())
        return build_step_batch(reqs, bool(admitted), self.device) if reqs else None

    def append_tokens(self, req_ids: List[str], token_ids: List[int]) -> List[str]:
        for rid, tok in zip(req_ids, token_ids):
            req = self.running[rid]
            req.output_ids.append(tok)
            if req.seq_len > len(req.pages) * PAGE_SIZE:
                req.pages += self._alloc_pages(1)
        return [rid for rid in req_ids if len(self.running[rid].output_ids) >= self.running[rid].max_tokens]

    def finish(self, rid: str) -> Optional[List[int]]:
        if (req := self.running.pop(rid, None)) is not None:
            self.free_pages.extend(req.pages)
        return None if req is None else req.pages
