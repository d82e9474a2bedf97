from dataclasses import dataclass
from typing import Tuple


@dataclass
class LoRAServeConfig:
    num_layers: int = 32
    hidden_size: int = 4096
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    max_loras: int = 8
    max_lora_rank: int = 64
    max_batch_size: int = 256
    max_num_tokens: int = 8192
    max_context_len: int = 32768
    long_context_threshold: int = 8192
    graph_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    target_modules: Tuple[str, ...] = ("qkv_proj", "o_proj")
    split_chunks: int = 16

    def max_pages_per_req(self) -> int:
        return (self.max_context_len + self.page_size - 1) // self.page_size

    def decode_workspace_bytes(self) -> int:
        # split-k partial outputs and LSE per row, head and chunk
        per_row = self.num_qo_heads * (self.head_dim + 1) * 4 * self.split_chunks
        return self.max_batch_size * per_row

    def prefill_workspace_bytes(self) -> int:
        return self.max_num_tokens * self.num_qo_heads * (self.head_dim + 1) * 4 * 2

    def module_dims(self, module: str) -> Tuple[int, int]:
        if module == "qkv_proj":
            out = (self.num_qo_heads + 2 * self.num_kv_heads) * self.head_dim
            return self.hidden_size, out
        return self.num_qo_heads * self.head_dim, self.hidden_size
