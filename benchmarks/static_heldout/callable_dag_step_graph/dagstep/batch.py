from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np
import torch

from dagstep.config import PAGE_SIZE

@dataclass
class Request:
    rid: str
    prompt: List[int]
    pages: List[int] = field(default_factory=list)
    output: List[int] = field(default_factory=list)
    temperature: float = 1.0
    num_computed: int = 0

@dataclass
class StepBatch:
    input_ids: torch.Tensor
    positions: torch.Tensor
    temperatures: torch.Tensor
    query_lens: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len: torch.Tensor
    query_start_loc_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    last_page_len_cpu: torch.Tensor
    seq_lens_cpu: torch.Tensor
    query_lens_np: np.ndarray
    is_prefill: bool
    num_seqs: int

@dataclass
class StepContext:
    step: int
    batch: Optional[StepBatch] = None
    logits: Optional[torch.Tensor] = None
    next_ids: Optional[torch.Tensor] = None
    finished: Optional[torch.Tensor] = None
    scratch: Optional[torch.Tensor] = None

def build_step_batch(reqs: List[Request], device: torch.device, is_prefill: bool) -> StepBatch:
    assert len(reqs) > 0, "empty step"  # expect: FC109
    q_lens = np.array([len(r.prompt) - r.num_computed if is_prefill else 1 for r in reqs], dtype=np.int32)
    s_lens = np.array([len(r.prompt) + len(r.output) for r in reqs], dtype=np.int32)
    qsl = np.zeros(len(reqs) + 1, dtype=np.int32)
    np.cumsum(q_lens, out=qsl[1:])
    n_pages = (s_lens + PAGE_SIZE - 1) // PAGE_SIZE
    indptr = np.zeros(len(reqs) + 1, dtype=np.int32)
    np.cumsum(n_pages, out=indptr[1:])
    indices = np.concatenate([np.asarray(r.pages[: n], dtype=np.int32) for r, n in zip(reqs, n_pages)])
    last = (s_lens - 1) % PAGE_SIZE + 1
    pos = np.concatenate([np.arange(s - q, s, dtype=np.int64) for s, q in zip(s_lens, q_lens)])
    ids = np.concatenate([np.asarray((r.prompt + r.output)[s - q: s], dtype=np.int64) for r, s, q in zip(reqs, s_lens, q_lens)])
    temps = np.array([r.temperature for r in reqs], dtype=np.float32)
    def up(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a).to(device, non_blocking=True)
    return StepBatch(
        input_ids=up(ids), positions=up(pos), temperatures=up(temps), query_lens=up(q_lens), seq_lens=up(s_lens),
        query_start_loc=up(qsl), kv_indptr=up(indptr), kv_indices=up(indices), last_page_len=up(last),
        query_start_loc_cpu=torch.from_numpy(qsl), kv_indptr_cpu=torch.from_numpy(indptr),
        last_page_len_cpu=torch.from_numpy(last), seq_lens_cpu=torch.from_numpy(s_lens), query_lens_np=q_lens,
        is_prefill=is_prefill, num_seqs=len(reqs),
    )
