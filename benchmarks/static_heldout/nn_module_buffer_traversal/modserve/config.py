"""Engine configuration and module-level constants."""

from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

import torch

PAGE_SIZE = 16
# The paged KV kernels are built for these page sizes only.
assert PAGE_SIZE in (1, 16, 32)  # ok: FC109

# Float workspace shared by the eager FA2 decode wrappers.
WORKSPACE_BYTES = 256 * 1024 * 1024

DEFAULT_CAPTURE_SIZES: Tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256)


@dataclasses.dataclass
class EngineConfig:
    num_layers: int = 32
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    hidden_size: int = 4096
    intermediate_size: int = 14336
    vocab_size: int = 128256
    rope_theta: float = 500000.0
    rms_norm_eps: float = 1e-5
    max_num_reqs: int = 256
    max_num_tokens: int = 8192
    max_context_len: int = 32768
    # Every ``global_every``-th layer attends to the whole context, the others to a window.
    sliding_window: Optional[int] = 4096
    global_every: int = 4
    cuda_graph_sizes: Tuple[int, ...] = DEFAULT_CAPTURE_SIZES
    disable_cuda_graph: bool = False
    kv_dtype: torch.dtype = torch.bfloat16
    use_trtllm_decode: bool = False
    # Scratch of the graph decode wrappers (trtllm-gen keeps its semaphores there); a field,
    # so each deployment sizes it.
    trtllm_workspace_bytes: int = 128 * 1024 * 1024
    window_workspace_bytes: int = 64 * 1024 * 1024
    enable_lookahead: bool = False
    lookahead_k: int = 4
    lookahead_reuse_plan: bool = True

    @property
    def pages_per_req(self) -> int:
        return (self.max_context_len + PAGE_SIZE - 1) // PAGE_SIZE

    @property
    def max_pages(self) -> int:
        return self.max_num_reqs * self.pages_per_req

    def prefill_workspace_bytes(self) -> int:
        # split-k partial outputs of the prefill planner: tokens x heads x (fp32 head + lse)
        per_token = self.num_qo_heads * (self.head_dim * 4 + 4)
        return max(2 * self.max_num_tokens * per_token, 64 << 20)

    def is_window_layer(self, layer_id: int) -> bool:
        return self.sliding_window is not None and (layer_id + 1) % self.global_every != 0
