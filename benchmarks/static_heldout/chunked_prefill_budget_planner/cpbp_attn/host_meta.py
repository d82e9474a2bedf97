"""Per-step metadata: numpy indptrs built from the scheduler's plan, device inputs beside host mirrors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

import numpy as np
import torch

from cpbp import PAGE_SIZE, StepPlan


@dataclass
class HostMeta:
    qo_indptr_np: np.ndarray
    kv_indptr_np: np.ndarray
    kv_indices_np: np.ndarray
    last_page_len_np: np.ndarray
    seq_lens_np: np.ndarray
    query_lens_np: np.ndarray
    num_decodes: int


def build_host_meta(plan: StepPlan, page_size: int = PAGE_SIZE) -> HostMeta:
    q = plan.query_lens_np()
    s = plan.seq_lens_np()
    pages = (s + page_size - 1) // page_size
    qo = np.concatenate(([0], np.cumsum(q))).astype(np.int32)
    kv = np.concatenate(([0], np.cumsum(pages))).astype(np.int32)
    indices = np.empty(int(kv[-1]), dtype=np.int32)
    for i, row in enumerate(plan.rows):
        indices[kv[i] : kv[i + 1]] = row.req.pages[: pages[i]]
    last = (s - 1) % page_size + 1
    return HostMeta(qo, kv, indices, last.astype(np.int32), s, q, plan.num_decodes)


def pad_indptr(indptr: np.ndarray, bs: int) -> np.ndarray:
    out = np.full(bs + 1, indptr[-1], dtype=np.int32)
    out[: len(indptr)] = indptr
    return out


def last_page_lens(seq_lens: torch.Tensor, page_size: int) -> torch.Tensor:
    return (seq_lens - 1) % page_size + 1


def prefill_token_offset(query_start_loc: torch.Tensor, num_decodes: int) -> int:
    """Tokens before the first prefill row (decode rows come first in a mixed batch)."""
    return int(query_start_loc[num_decodes])  # expect: FC101


@dataclass
class StepInput:
    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    query_start_loc: torch.Tensor
    query_start_loc_cpu: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    query_lens: torch.Tensor
    num_decodes: int
    host: HostMeta

    @property
    def num_reqs(self) -> int:
        return self.seq_lens_cpu.shape[0]

    @property
    def num_prefills(self) -> int:
        return self.num_reqs - self.num_decodes

    @property
    def max_query_len(self) -> int:
        return int(self.query_lens.max())  # expect: FC101


def _tokens_positions_slots(plan: StepPlan, page_size: int) -> Tuple[List[int], List[int], List[int]]:
    ids, positions, slots = [], [], []  # type: List[int], List[int], List[int]
    for row in plan.rows:
        for p in range(row.req.num_computed, row.req.num_computed + row.num_new_tokens):
            ids.append(row.req.token_at(p))
            positions.append(p)
            slots.append(row.req.pages[p // page_size] * page_size + p % page_size)
    return ids, positions, slots


def make_step_input(plan: StepPlan, host: HostMeta, device: torch.device, page_size: int) -> StepInput:
    ids, positions, slots = _tokens_positions_slots(plan, page_size)
    qsl_cpu = torch.from_numpy(host.qo_indptr_np)
    seq_lens_cpu = torch.from_numpy(host.seq_lens_np)
    return StepInput(
        input_ids=torch.tensor(ids, dtype=torch.int64).to(device, non_blocking=True),
        positions=torch.tensor(positions, dtype=torch.int64).to(device, non_blocking=True),
        slot_mapping=torch.tensor(slots, dtype=torch.int64).to(device, non_blocking=True),
        query_start_loc=qsl_cpu.to(device, non_blocking=True),
        query_start_loc_cpu=qsl_cpu,
        seq_lens=seq_lens_cpu.to(device, non_blocking=True),
        seq_lens_cpu=seq_lens_cpu,
        query_lens=torch.from_numpy(host.query_lens_np).to(device, non_blocking=True),
        num_decodes=plan.num_decodes,
        host=host,
    )
