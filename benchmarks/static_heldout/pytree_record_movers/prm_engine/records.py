"""Per-step records: dataclasses and NamedTuples of tensors, moved generically.

Every record walks ``dataclasses.fields()`` instead of naming its tensors, so a new field is moved,
pinned and copied without touching the movers. Fields tagged ``metadata={"host": True}`` are host
mirrors and stay where they are.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Dict, NamedTuple, Optional

import torch

HOST = {"host": True}


def is_host_field(f: dataclasses.Field) -> bool:
    return bool(f.metadata.get("host", False))


class TensorRecord:
    """Mixin for dataclasses whose fields are tensors, host mirrors or plain values."""

    def _map_tensors(self, fn, include_host: bool = False):
        changes: Dict[str, Any] = {}
        for f in fields(self):
            if not f.init or (is_host_field(f) and not include_host):
                continue
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                changes[f.name] = fn(value)
        return dataclasses.replace(self, **changes)

    def to(self, device, non_blocking: bool = False):
        assert device is not None, "TensorRecord.to() needs a device"  # expect: FC109
        return self._map_tensors(lambda t: t.to(device, non_blocking=non_blocking))

    def pin(self):
        return self._map_tensors(lambda t: t.pin_memory(), include_host=True)

    def cpu(self):
        out: Dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = value.cpu() if isinstance(value, torch.Tensor) else value  # expect: FC101
        return type(self)(**out)

    def tensor_items(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                yield f.name, value


class ForwardMode(enum.IntEnum):
    EXTEND = 1
    DECODE = 2

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE


@dataclass
class SamplingRecord(TensorRecord):
    temperatures: torch.Tensor
    top_ps: torch.Tensor
    top_ks: torch.Tensor
    min_tokens_left: torch.Tensor
    temperatures_cpu: Optional[torch.Tensor] = field(default=None, metadata=HOST)

    @classmethod
    def empty(cls, n: int, device) -> "SamplingRecord":
        return cls(
            temperatures=torch.ones(n, dtype=torch.float32, device=device),
            top_ps=torch.ones(n, dtype=torch.float32, device=device),
            top_ks=torch.full((n,), -1, dtype=torch.int32, device=device),
            min_tokens_left=torch.zeros(n, dtype=torch.int32, device=device),
        )


@dataclass
class ForwardBatch(TensorRecord):
    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    req_pool_indices: torch.Tensor
    out_cache_loc: torch.Tensor
    seq_lens_cpu: Optional[torch.Tensor] = field(default=None, metadata=HOST)
    extend_seq_lens_cpu: Optional[torch.Tensor] = field(default=None, metadata=HOST)
    sampling: Optional[SamplingRecord] = None
    use_graph: bool = False
    return_logprob: bool = False

    def __post_init__(self):
        assert self.input_ids.shape[0] == self.positions.shape[0], "ids/positions mismatch"  # expect: FC109


@dataclass
class StaticInputs(TensorRecord):
    """The graph runner's persistent inputs; the captured graphs read these by address."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    req_pool_indices: torch.Tensor
    out_cache_loc: torch.Tensor

    @classmethod
    def allocate(cls, max_bs: int, device) -> "StaticInputs":
        i64 = dict(dtype=torch.int64, device=device)
        return cls(
            input_ids=torch.zeros(max_bs, **i64),
            positions=torch.zeros(max_bs, **i64),
            seq_lens=torch.ones(max_bs, dtype=torch.int32, device=device),
            req_pool_indices=torch.zeros(max_bs, **i64),
            out_cache_loc=torch.zeros(max_bs, **i64),
        )


@dataclass
class PagedIndexRecord(TensorRecord):
    kv_indptr: torch.Tensor
    kv_last_page_len: torch.Tensor
    num_pages: int = 0


@dataclass
class SampleResult(TensorRecord):
    next_token_ids: torch.Tensor
    logprobs: Optional[torch.Tensor] = None


@dataclass
class AttnScratch(TensorRecord):
    """Kernel scratch of the attention backend, moved and reported like any other record."""

    float_ws: torch.Tensor
    trtllm_ws: torch.Tensor
    FLOAT_BYTES: ClassVar[int] = 192 << 20

    @classmethod
    def allocate(cls, trtllm_bytes: int, device) -> "AttnScratch":
        float_ws = torch.empty(cls.FLOAT_BYTES, dtype=torch.uint8, device=device)  # expect: FC106  # ok: FC105
        trtllm_ws = torch.empty(trtllm_bytes, dtype=torch.uint8, device=device)  # expect: FC105  # ok: FC106
        return cls(float_ws=float_ws, trtllm_ws=trtllm_ws)


class DecodePlanArgs(NamedTuple):
    indptr: torch.Tensor
    indices: torch.Tensor
    last_page_len: torch.Tensor
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int


@dataclass
class PrefillPlanArgs:
    qo_indptr: torch.Tensor
    paged_kv_indptr: torch.Tensor
    paged_kv_indices: torch.Tensor
    paged_kv_last_page_len: torch.Tensor
    num_qo_heads: int
    num_kv_heads: int
    head_dim_qk: int
    page_size: int
    causal: bool = True


class DecodeMeta(NamedTuple):
    wrapper: Any
    kv_indptr: torch.Tensor
    kv_last_page_len: torch.Tensor
    seq_lens: torch.Tensor
    max_len: int
    use_cascade: bool


class PlanRecord:
    """What the engine planned last for one batch size (its own bookkeeping, not FlashInfer's)."""

    def __init__(self, bs: int, num_pages: int):
        self.bs = bs
        self.num_pages = num_pages
        self._plan_info = (bs, num_pages)

    def same_as(self, other: "PlanRecord") -> bool:
        return self._plan_info == (other.bs, other.num_pages)  # ok: FC103
