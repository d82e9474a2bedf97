"""Request-level connector metadata, rebuilt by the scheduler side every step."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch

from kvconn.config import ConnectorConfig


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def slot_range(block_ids_np: np.ndarray, start: int, end: int, block_size: int) -> np.ndarray:
    """Slot ids of tokens ``[start, end)`` of a request whose blocks are ``block_ids_np``."""
    pos = np.arange(start, end, dtype=np.int64)
    return block_ids_np[pos // block_size] * block_size + pos % block_size


@dataclass
class ReqMeta:
    req_id: str
    block_ids_np: np.ndarray             # local block ids, host
    block_ids: torch.Tensor              # the same ids on the device, for the scatter kernels
    num_tokens: int
    load_remote: bool
    save_slots: Optional[torch.Tensor] = None   # device slot ids of the tokens to ship, padded with -1
    remote_engine_id: str = ""
    remote_block_ids: List[int] = field(default_factory=list)


@dataclass
class ConnectorMetadata:
    step: int
    requests: List[ReqMeta] = field(default_factory=list)

    @property
    def num_loads(self) -> int:
        return sum(1 for r in self.requests if r.load_remote)

    @property
    def num_saves(self) -> int:
        return sum(1 for r in self.requests if r.save_slots is not None)


@dataclass
class _Pending:
    block_ids: List[int]
    num_computed: int
    num_new: int
    load_remote: bool
    remote_engine_id: str
    remote_block_ids: List[int]


class ConnectorMetadataBuilder:
    """Scheduler side: collects what each request loads or saves, once per step."""

    SAVE_VECTOR_WIDTH = 8

    def __init__(self, cfg: ConnectorConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self._pending: Dict[str, _Pending] = {}
        self._step = 0

    def add_request(
        self,
        req_id: str,
        block_ids: Sequence[int],
        num_computed_tokens: int,
        num_new_tokens: int,
        load_remote: bool = False,
        remote_engine_id: str = "",
        remote_block_ids: Sequence[int] = (),
    ) -> None:
        need = cdiv(num_computed_tokens + num_new_tokens, self.cfg.block_size)
        assert len(block_ids) >= need, "scheduler handed the connector too few blocks"  # expect: FC109
        self._pending[req_id] = _Pending(
            list(block_ids[:need]),
            num_computed_tokens,
            num_new_tokens,
            load_remote,
            remote_engine_id,
            list(remote_block_ids),
        )

    def _save_slots(self, ids_np: np.ndarray, p: _Pending) -> Optional[torch.Tensor]:
        if self.cfg.role != "producer" or p.num_new == 0:
            return None
        slots_np = slot_range(ids_np, p.num_computed, p.num_computed + p.num_new, self.cfg.block_size)
        width = self.SAVE_VECTOR_WIDTH
        padded = np.full(cdiv(len(slots_np), width) * width, -1, dtype=np.int64)
        padded[: len(slots_np)] = slots_np
        return torch.from_numpy(padded).to(self.device, non_blocking=True)

    def build(self) -> ConnectorMetadata:
        meta = ConnectorMetadata(step=self._step)
        for req_id, p in self._pending.items():
            ids_np = np.asarray(p.block_ids, dtype=np.int64)
            ids = torch.from_numpy(ids_np).to(self.device, non_blocking=True)
            meta.requests.append(
                ReqMeta(
                    req_id=req_id,
                    block_ids_np=ids_np,
                    block_ids=ids,
                    num_tokens=p.num_computed + p.num_new,
                    load_remote=p.load_remote,
                    save_slots=self._save_slots(ids_np, p),
                    remote_engine_id=p.remote_engine_id,
                    remote_block_ids=p.remote_block_ids,
                )
            )
        self._pending.clear()
        self._step += 1
        return meta
