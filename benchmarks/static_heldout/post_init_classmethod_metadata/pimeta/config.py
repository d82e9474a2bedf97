"""Serving limits, and the workspace sizes that sit beside them."""
import dataclasses
from typing import ClassVar

import torch

PAGE_SIZE = 16
GRAPH_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)
DECODE_WORKSPACE_BYTES = 192 * 1024 * 1024
TRTLLM_DECODE_WORKSPACE_BYTES = 256 * 1024 * 1024
assert GRAPH_BATCH_SIZES == tuple(sorted(GRAPH_BATCH_SIZES)), "graph batch sizes must be sorted"  # ok: FC109


def sm_scratch_bytes() -> int:
    """trtllm-gen context scratch scales with the SM count of the device, not with the batch."""
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count * (2 << 20)


@dataclasses.dataclass(frozen=True)
class ServeConfig:
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = PAGE_SIZE
    max_batch_size: int = 64
    max_num_tokens: int = 8192
    max_pages: int = 1 << 16
    workspace_bytes: int = 256 * 1024 * 1024
    sliding_window: int = 4096
    num_draft_tokens: int = 0
    use_trtllm_decode: bool = False
    DRAFT_WORKSPACE_BYTES: ClassVar[int] = 32 * 1024 * 1024

    def plan_dims(self) -> tuple:
        return self.num_qo_heads, self.num_kv_heads, self.head_dim, self.page_size
