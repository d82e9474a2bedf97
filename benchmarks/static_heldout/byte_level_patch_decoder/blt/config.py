"""Configuration of the byte-level patch model and its serving limits."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Tuple

# Scratch of the local decoder's byte-to-patch cross-attention (ragged, FA2).
XATTN_WORKSPACE_BYTES = 96 * 1024 * 1024

PatchBuckets = Tuple[int, ...]


def _default_buckets() -> PatchBuckets:
    return (1, 2, 4, 8, 16, 32, 64)


@dataclass
class ByteModelConfig:
    num_byte_tokens: int = 260  # 256 bytes + BOS/EOS/PAD/BOUNDARY
    local_dim: int = 512
    global_dim: int = 2048
    num_qo_heads: int = 16
    num_kv_heads: int = 4
    head_dim: int = 128
    num_global_layers: int = 24
    num_local_layers: int = 2
    page_size: int = 16
    max_batch: int = 64
    max_patches_per_seq: int = 2048
    max_patch_len: int = 12
    entropy_threshold: float = 1.4
    patch_buckets: PatchBuckets = field(default_factory=_default_buckets)
    decode_workspace_bytes: int = 256 * 1024 * 1024
    use_trtllm_eager: bool = True

    @property
    def max_pages(self) -> int:
        return self.max_batch * (self.max_patches_per_seq // self.page_size + 1)

    @property
    def max_bytes_per_step(self) -> int:
        return self.max_batch * self.max_patch_len

    def prefill_workspace_bytes(self) -> int:
        rows = self.max_batch * self.max_patches_per_seq
        return rows * self.num_qo_heads * self.head_dim * 4 + (16 << 20)
