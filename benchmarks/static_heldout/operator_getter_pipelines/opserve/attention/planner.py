"""Plan helpers: page counts on the host, decode plan arguments, and the decode plan call."""

from __future__ import annotations

import dataclasses
import functools
import operator
from typing import Dict, Tuple

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from opserve.config import EngineConfig


@dataclasses.dataclass(frozen=True)
class DecodePlanArgs:
    indptr: torch.Tensor
    indices: torch.Tensor
    last_page_len: torch.Tensor
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    q_data_type: torch.dtype
    kv_data_type: torch.dtype


# plan()'s positional parameters, in order.
_PLAN_POSITIONAL = ("indptr", "indices", "last_page_len", "num_qo_heads", "num_kv_heads", "head_dim", "page_size")
_positional = operator.attrgetter(*_PLAN_POSITIONAL)


def _pages_for(seq_len: int, page_size: int) -> int:
    assert seq_len >= 0, "negative sequence length"  # expect: FC109
    return -(-seq_len // page_size)


def pages_per_request(seq_lens_host: torch.Tensor, page_size: int) -> torch.Tensor:
    """Pages each request occupies, from the host copy of its length."""
    counts = map(functools.partial(_pages_for, page_size=page_size), seq_lens_host.tolist())
    return torch.tensor(list(counts), dtype=torch.int32)


def decode_plan_args(
    cfg: EngineConfig,
    indptr_host: torch.Tensor,
    indices: torch.Tensor,
    last_page_len_host: torch.Tensor,
    batch_size: int,
) -> DecodePlanArgs:
    assert indptr_host.numel() == batch_size + 1, "indptr must hold batch_size + 1 offsets"  # expect: FC109
    return DecodePlanArgs(
        indptr_host,
        indices,
        last_page_len_host,
        cfg.num_qo_heads,
        cfg.num_kv_heads,
        cfg.head_dim,
        cfg.page_size,
        cfg.dtype,
        cfg.kv_dtype,
    )


def plan_decode(w: BatchDecodeWithPagedKVCacheWrapper, args: DecodePlanArgs) -> None:
    operator.methodcaller(  # ok: FC102
        "plan",
        *_positional(args),
        q_data_type=args.q_data_type,
        kv_data_type=args.kv_data_type,
    )(w)


class PlanCache:
    """Remembers the (raw batch, page count) each graph bucket was last planned for."""

    def __init__(self) -> None:
        self._plan_info: Dict[int, Tuple[int, int]] = {}  # ok: FC103

    def unchanged(self, bs: int, key: Tuple[int, int]) -> bool:
        return self._plan_info.get(bs) == key

    def record(self, bs: int, key: Tuple[int, int]) -> None:
        self._plan_info[bs] = key
