"""Server arguments and the process-wide FlashInfer knobs (SGLang's ``ServerArgs`` / ``global_config``)."""

from __future__ import annotations

import dataclasses
import os
from typing import Tuple


class GlobalConfig:
    """Process-wide settings, set once at import like SGLang's ``global_config``."""

    def __init__(self) -> None:
        # Float workspace shared by every FA2 wrapper of the attention backend.
        self.flashinfer_workspace_size = 384 * 1024 * 1024
        # Block size of the page-id remap kernel (the autotune table picks one when this is None).
        self.kv_index_block_size = 512
        self.verbosity = int(os.environ.get("TKVI_VERBOSITY", "0"))


global_config = GlobalConfig()


@dataclasses.dataclass
class ServerArgs:
    model_path: str = "meta-llama/Llama-3.1-8B-Instruct"
    dtype: str = "bfloat16"
    max_running_requests: int = 256
    max_total_tokens: int = 1 << 20
    max_context_len: int = 32768
    chunked_prefill_size: int = 8192
    page_size: int = 1
    vocab_size: int = 128256
    hidden_size: int = 4096
    num_attention_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    num_layers: int = 32
    # Every `sliding_window_every`-th layer attends to the last `sliding_window_size` tokens (0 disables).
    sliding_window_size: int = 4096
    sliding_window_every: int = 4
    # Gemma-2 style attention logit soft-capping (0 disables).
    logit_soft_cap: float = 0.0
    # Layers are split into `num_kv_groups` groups; groups past the first keep their own decode plan.
    num_kv_groups: int = 1
    # Layers that add a learned sink logit to the softmax and therefore need the attention LSE.
    attention_sink_layers: Tuple[int, ...] = ()
    attention_kernel: str = "fa2"  # "fa2", or "trtllm-gen" on Blackwell
    prefill_workspace_mb: int = 256
    swa_workspace_mb: int = 128
    ragged_min_tokens: int = 256
    cuda_graph_max_bs: int = 160
    disable_cuda_graph: bool = False
    kv_defrag_threshold: float = 0.35

    @classmethod
    def from_env(cls) -> "ServerArgs":
        args = cls()
        if "TKVI_MAX_RUNNING" in os.environ:
            args.max_running_requests = int(os.environ["TKVI_MAX_RUNNING"])
        if os.environ.get("TKVI_ATTENTION_KERNEL"):
            args.attention_kernel = os.environ["TKVI_ATTENTION_KERNEL"]
        if os.environ.get("TKVI_SWA_WORKSPACE_MB"):
            args.swa_workspace_mb = int(os.environ["TKVI_SWA_WORKSPACE_MB"])
        args.disable_cuda_graph = os.environ.get("TKVI_DISABLE_CUDA_GRAPH", "0") == "1"
        return args

    @property
    def use_trtllm(self) -> bool:
        return self.attention_kernel == "trtllm-gen"

    def kv_group_of(self, layer_id: int) -> int:
        return layer_id * self.num_kv_groups // self.num_layers

    def is_sliding_layer(self, layer_id: int) -> bool:
        every = self.sliding_window_every
        return self.sliding_window_size > 0 and every > 0 and layer_id % every == every - 1
