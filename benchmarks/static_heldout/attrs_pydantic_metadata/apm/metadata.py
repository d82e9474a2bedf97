"""Per-step batch and attention metadata, as attrs classes."""

from __future__ import annotations

from typing import Any, Dict, Optional

import attr
import attrs
import torch


def _to_int32(t: torch.Tensor) -> torch.Tensor:
    # The scheduler hands int64 index tensors; FlashInfer wants int32 (same device).
    return t if t.dtype == torch.int32 else t.to(torch.int32)  # ok: FC101


def _host_copy(t: torch.Tensor) -> torch.Tensor:
    # plan() reads its indptr on the host; accept whatever the caller has at hand.
    return t.to("cpu") if t.is_cuda else t  # expect: FC101


@attrs.frozen
class ForwardBatch:
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor
    out_cache_loc: torch.Tensor
    is_decode: bool = True
    qo_indptr: Optional[torch.Tensor] = None
    extend_lens: Optional[torch.Tensor] = None
    prefix_lens_cpu: Optional[torch.Tensor] = None

    @property
    def batch_size(self) -> int:
        return self.seq_lens_cpu.shape[0]

    @classmethod
    def from_host(cls, h: Dict[str, torch.Tensor], device: torch.device, is_decode: bool = True) -> "ForwardBatch":
        up = {k: v.to(device, non_blocking=True) for k, v in h.items()}
        return cls(up["input_ids"], up["positions"], up["seq_lens"], h["seq_lens"], up["kv_indptr"], h["kv_indptr"],
                   up["kv_indices"], up["kv_last_page_len"], h["kv_last_page_len"], up["out_cache_loc"], is_decode,
                   up.get("qo_indptr"), up.get("extend_lens"), h.get("prefix_lens"))


@attrs.define
class DecodeMetadata:
    wrapper: Any
    swa_wrapper: Any
    kv_indptr: torch.Tensor = attrs.field(converter=_to_int32)
    kv_indices: torch.Tensor = attrs.field(converter=_to_int32)
    kv_last_page_len: torch.Tensor = attrs.field(converter=_to_int32)
    seq_lens: torch.Tensor = attrs.field()
    seq_lens_cpu: torch.Tensor = attrs.field()
    kv_indptr_cpu: torch.Tensor = attrs.field()
    bucket: Optional[int] = None
    custom_mask: Optional[torch.Tensor] = None
    max_seq_len_host: int = attrs.field(init=False, default=0)

    @seq_lens.validator
    def _check_seq_lens(self, attribute: Any, value: torch.Tensor) -> None:
        if (value <= 0).any():  # expect: FC101
            raise ValueError(f"{attribute.name} must be positive")

    def __attrs_post_init__(self) -> None:
        self.max_seq_len_host = int(self.seq_lens_cpu.max())  # ok: FC101

    @property
    def max_kv_len(self) -> int:
        return int(self.seq_lens.max())  # expect: FC101


@attr.s(auto_attribs=True, slots=True)
class PrefillMetadata:
    ragged: Any
    paged: Any
    qo_indptr: torch.Tensor
    qo_indptr_host: torch.Tensor = attr.ib(converter=_host_copy)
    prefix_lens_cpu: Optional[torch.Tensor] = None
    num_tokens: int = attr.ib(init=False, default=0)
    token_rows: Optional[torch.Tensor] = attr.ib(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        self.num_tokens = int(self.qo_indptr[-1])  # expect: FC101
        self.token_rows = torch.empty(self.num_tokens, dtype=torch.int64, device=self.qo_indptr.device)  # ok: FC107


@attrs.define
class VerifyMetadata:
    prefix: Any  # paged prefill wrapper over the committed prefix
    tree: Any  # ragged wrapper over the draft tokens
    qo_indptr_cpu: torch.Tensor
    num_draft_tokens: int = attrs.field(validator=attrs.validators.gt(0))


@attrs.define
class AcceptRecord:
    last_page_len: torch.Tensor
    num_accepted: torch.Tensor
    page_size: int

    def __attrs_post_init__(self) -> None:
        assert self.page_size > 0, "page_size"  # expect: FC109
        self.last_page_len.add_(self.num_accepted - 1).remainder_(self.page_size).add_(1)  # expect: FC104


@attrs.define
class GraphEntry:
    graph: torch.cuda.CUDAGraph
    meta: DecodeMetadata
    out: torch.Tensor


@attrs.define
class WrapperSnapshot:
    name: str
    wrapper: Any = attrs.field(repr=False)
    plan_info: Any = attrs.field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        self.plan_info = self.wrapper._plan_info  # expect: FC103
