"""Transfer handles: what a prefill worker hands the decode pool for one request."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import torch


class TransferState(enum.Enum):
    PENDING, IN_FLIGHT, LANDED, FAILED = range(4)


@dataclass
class KVTransferHandle:
    request_id: str
    # destination pages in the decode pool: a device copy for the scatter, a host copy for tables
    page_ids: torch.Tensor
    page_ids_cpu: torch.Tensor
    num_pages: int
    seq_len: int
    first_token: int
    ready_event: Optional[torch.cuda.Event] = None
    state: TransferState = TransferState.PENDING
    meta: Dict[str, Any] = field(default_factory=dict)


def make_handle(request_id: str, dst_pages: List[int], seq_len: int, first_token: int,
                device: torch.device, same_device: bool = True) -> KVTransferHandle:
    page_ids_cpu = torch.tensor(dst_pages, dtype=torch.int32)
    return KVTransferHandle(
        request_id=request_id, page_ids=page_ids_cpu.to(device, non_blocking=True),
        page_ids_cpu=page_ids_cpu, num_pages=len(dst_pages), seq_len=seq_len, first_token=first_token,
        meta={"same_device": same_device},
    )
