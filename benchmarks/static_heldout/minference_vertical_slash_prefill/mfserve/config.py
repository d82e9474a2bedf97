from dataclasses import dataclass
from typing import Tuple

# Scratch for the block-sparse planner; "large enough for 128K prompts" on the benchmark box.
SPARSE_WORKSPACE_BYTES = 256 * 1024 * 1024


@dataclass
class MInferenceConfig:
    vocab_size: int = 128256
    hidden: int = 4096
    num_layers: int = 32
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    kv_layout: str = "NHD"
    # sparse pattern estimation (MInference "vertical_and_slash")
    block_size: int = 64
    last_q: int = 64
    vertical_size: int = 1024
    slash_size: int = 6144
    min_sparse_len: int = 32768
    # limits
    max_batch: int = 64
    max_num_tokens: int = 262144
    max_pages: int = 65536
    max_pages_per_seq: int = 16384
    long_ctx_len: int = 131072
    decode_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    prefill_workspace_bytes: int = 512 * 1024 * 1024
    split_long_rows: bool = True
    use_trtllm_context: bool = False

    def decode_workspace_bytes(self) -> int:
        # split-k partials: batch x heads x head_dim x fp32 x max chunks, plus the planner's int area
        return self.max_batch * self.num_qo_heads * self.head_dim * 4 * 64 + (16 << 20)

    def context_workspace_bytes(self) -> int:
        return self.max_num_tokens * self.num_qo_heads * 8 + (64 << 20)
