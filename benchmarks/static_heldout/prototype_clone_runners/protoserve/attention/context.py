"""What a decoder layer needs to attend in one forward: the step record and the wrappers."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Optional

from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    MultiLevelCascadeAttentionWrapper,
)

from protoserve.metadata import StepMetadata

if TYPE_CHECKING:
    from protoserve_kernels.trtllm_decode import TrtllmDecodeKernel


@dataclasses.dataclass
class AttnContext:
    meta: StepMetadata
    decode_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper] = None
    prefill_wrapper: Optional[BatchPrefillWithPagedKVCacheWrapper] = None
    cascade_wrapper: Optional[MultiLevelCascadeAttentionWrapper] = None
    verify_wrapper: Optional[BatchPrefillWithPagedKVCacheWrapper] = None
    trtllm: Optional["TrtllmDecodeKernel"] = None
    is_extend: bool = False
