import os
from dataclasses import dataclass
from typing import Tuple

DECODE_WS_MIB = 256
_WS_TIERS = (64 << 20, 128 << 20, 512 << 20)
assert DECODE_WS_MIB > 0 and len(_WS_TIERS) == 3  # ok: FC109


class WorkspaceSizes:
    GRAPH = 96 << 20
    TRTLLM_MB_ENV = "RC_TRTLLM_WS_MB"


def trtllm_workspace_bytes() -> int:
    return int(os.getenv(WorkspaceSizes.TRTLLM_MB_ENV, "128")) << 20


@dataclass(frozen=True)
class ServeConfig:
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    max_batch: int = 256
    max_tokens: int = 16384
    total_pages: int = 131072
    capture_batch_sizes: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    cascade_workspace_bytes: int = 256 << 20
    device: str = "cuda"
