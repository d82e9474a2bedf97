"""Per-step batch objects. The engine and the attention backend `match` on their classes."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import torch

from .config import PAGE_SIZE


@dataclass
class DecodeBatch:
    input_ids: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    seq_lens: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    seq_lens_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor
    window: bool = False
    softcap: bool = False
    draft_step: int = 0
    scratch: Optional[torch.Tensor] = None

    @property
    def batch_size(self) -> int:
        return self.seq_lens_cpu.shape[0]


@dataclass
class PrefillBatch:
    input_ids: torch.Tensor
    slots: torch.Tensor
    qo_indptr: torch.Tensor
    extend_lens: torch.Tensor
    kv_indices: torch.Tensor
    qo_indptr_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor
    max_extend_len: int
    has_prefix: bool = False


@torch.jit.script
def last_page_lens(seq_lens: torch.Tensor, page_size: int) -> torch.Tensor:
    assert page_size > 0  # ok: FC109
    return (seq_lens - 1) % page_size + 1


def _page_table(reqs: List[Dict[str, Any]]):
    indptr, flat = [0], []
    for r in reqs:
        flat.extend(r["pages"])
        indptr.append(indptr[-1] + len(r["pages"]))
    return torch.tensor(indptr, dtype=torch.int32), torch.tensor(flat, dtype=torch.int32)


def build_decode_batch(reqs: List[Dict[str, Any]], device: torch.device, *, window: bool = False,
                       softcap: bool = False) -> DecodeBatch:
    assert reqs, "decode batch needs at least one request"  # expect: FC109
    indptr_cpu, flat = _page_table(reqs)
    lens_cpu = torch.tensor([r["seq_len"] for r in reqs], dtype=torch.int32)
    last_cpu = last_page_lens(lens_cpu, PAGE_SIZE)
    ids = torch.tensor([[r["last_token"], r["slot"]] for r in reqs], dtype=torch.int64).to(device, non_blocking=True)
    return DecodeBatch(ids[:, 0], (lens_cpu - 1).to(device, non_blocking=True), ids[:, 1],
                       lens_cpu.to(device, non_blocking=True), indptr_cpu.to(device, non_blocking=True),
                       flat.to(device, non_blocking=True), last_cpu.to(device, non_blocking=True),
                       lens_cpu, indptr_cpu, last_cpu, window=window, softcap=softcap)


def build_prefill_batch(reqs: List[Dict[str, Any]], device: torch.device) -> PrefillBatch:
    indptr_cpu, flat = _page_table(reqs)
    ext = [len(r["new_tokens"]) for r in reqs]
    qo_cpu = torch.cumsum(torch.tensor([0] + ext, dtype=torch.int32), 0, dtype=torch.int32)
    seq_lens_cpu = torch.tensor([r["seq_len"] for r in reqs], dtype=torch.int32)
    tokens = torch.tensor([[t, s] for r in reqs for t, s in zip(r["new_tokens"], r["new_slots"])], dtype=torch.int64)
    return PrefillBatch(
        input_ids=tokens[:, 0].to(device, non_blocking=True), slots=tokens[:, 1].to(device, non_blocking=True),
        qo_indptr=qo_cpu.to(device, non_blocking=True), extend_lens=torch.tensor(ext, dtype=torch.int32, device=device),
        kv_indices=flat.to(device, non_blocking=True), qo_indptr_cpu=qo_cpu, kv_indptr_cpu=indptr_cpu,
        kv_last_page_len_cpu=last_page_lens(seq_lens_cpu, PAGE_SIZE),
        max_extend_len=max(ext),  # ok: FC101
        has_prefix=any(r["seq_len"] > n for r, n in zip(reqs, ext)))
