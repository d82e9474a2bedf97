"""Configuration of the quantized-KV serving engine."""
from __future__ import annotations

import enum
import os
from dataclasses import dataclass
from typing import Tuple

# Float workspace of the eager fp16 fallback decode (ops may override it).
FALLBACK_WORKSPACE_BYTES = int(os.environ.get("QKV_FALLBACK_WORKSPACE_BYTES", 128 << 20))
# Floor of the prompt-prefill workspace; the real size follows max_prefill_tokens.
MIN_PREFILL_WORKSPACE_BYTES = 64 << 20

FP8_E4M3_MAX = 448.0
INT4_MAX = 7


class KVDtype(str, enum.Enum):
    INT4 = "int4"
    FP8 = "fp8_e4m3"


@dataclass(frozen=True)
class QuantKVConfig:
    num_layers: int = 40
    hidden_size: int = 5120
    vocab_size: int = 152064
    num_qo_heads: int = 40
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    num_pages: int = 131072
    staging_pages: int = 16384  # bf16 pages the INT4 layers are dequantized into each step
    max_batch_size: int = 256
    max_pages_per_req: int = 4096
    max_prefill_tokens: int = 8192
    group_size: int = 32  # INT4 quantization group along head_dim
    graph_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    fp8_layers: Tuple[int, ...] = (0, 1, 38, 39)  # accuracy-sensitive layers kept in FP8
    decode_workspace_bytes: int = 256 << 20
    use_trtllm_fp8: bool = False
    eos_token_id: int = 151645

    @property
    def groups_per_head(self) -> int:
        return self.head_dim // self.group_size

    @property
    def max_seq_len(self) -> int:
        return self.max_pages_per_req * self.page_size

    def context_workspace_bytes(self) -> int:
        return self.max_prefill_tokens * self.num_qo_heads * self.head_dim * 4

    def kv_dtype_of(self, layer_id: int) -> KVDtype:
        return KVDtype.FP8 if layer_id in self.fp8_layers else KVDtype.INT4
