"""Engine configuration and process-wide constants."""
from dataclasses import dataclass
from typing import Tuple

PAGE_SIZE = 16
assert PAGE_SIZE & (PAGE_SIZE - 1) == 0  # ok: FC109
PREFILL_WORKSPACE_BYTES = 256 * 1024 * 1024


@dataclass
class EngineConfig:
    num_layers: int = 32
    num_draft_layers: int = 0
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 128256
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 32768
    num_pages: int = 32768
    sliding_window: int = 4096
    window_layers: Tuple[int, ...] = ()
    shared_prefix_len: int = 0
    long_context_threshold: int = 16384
    use_trtllm_decode: bool = False
    decode_workspace_bytes: int = 128 * 1024 * 1024
    cuda_graph_batch_sizes: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    eos_token_id: int = 2
    return_prompt_logprobs: bool = False

    def graph_workspace_bytes(self) -> int:  # split-k partials of the largest bucket, 16 chunks
        return max(self.max_num_seqs * self.num_qo_heads * self.head_dim * 4 * 16, 64 << 20)
