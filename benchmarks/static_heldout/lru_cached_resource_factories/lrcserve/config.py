"""Engine configuration: a dataclass filled from the model's config and the environment."""
from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass

import torch

from . import envs


@dataclass
class EngineConfig:
    model_path: str
    draft_model_path: str = ""
    num_layers: int = 32
    hidden_size: int = 4096
    intermediate_size: int = 14336
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 128256
    draft_vocab_size: int = 32768
    rope_theta: float = 500000.0
    dtype: torch.dtype = torch.bfloat16
    page_size: int = envs.PAGE_SIZE
    num_pages: int = 65536
    max_running_requests: int = 512
    max_batch_size: int = envs.MAX_BATCH_SIZE
    max_num_tokens: int = 16384
    max_context_len: int = 32768
    capture_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160)
    num_draft_tokens: int = 4
    sliding_window: int = envs.SLIDING_WINDOW
    window_layers: tuple[int, ...] = ()
    eos_token_id: int = 128009
    # workspace of the sliding-window decode wrapper; per deployment
    workspace_bytes: int = 192 << 20
    # rows longer than this decode on trtllm-gen (0: never)
    trtllm_min_seq_len: int = 0
    trtllm_raw_kernel: bool = True
    max_kv_splits: int = 32

    def __post_init__(self) -> None:
        assert self.max_batch_size >= max(self.capture_sizes), "capture sizes exceed max_batch_size"  # expect: FC109
        if self.page_size not in (1, 8, 16, 32, 64):
            raise ValueError(f"page_size={self.page_size} is not supported by the decode kernels")
        if self.num_qo_heads % self.num_kv_heads:
            raise ValueError(f"{self.num_qo_heads} query heads do not group over {self.num_kv_heads} KV heads")

    @functools.cached_property
    def max_pages_per_seq(self) -> int:
        return -(-self.max_context_len // self.page_size)

    def trtllm_workspace_bytes(self) -> int:
        """trtllm-gen scratch: split-k partial outputs and semaphores for the largest batch."""
        rows = self.max_batch_size * (self.num_draft_tokens + 1)
        return rows * self.num_qo_heads * self.max_kv_splits * (self.head_dim * 4 + 8) + (4 << 20)


_HF_KEYS = {
    "num_hidden_layers": "num_layers",
    "hidden_size": "hidden_size",
    "intermediate_size": "intermediate_size",
    "num_attention_heads": "num_qo_heads",
    "num_key_value_heads": "num_kv_heads",
    "vocab_size": "vocab_size",
    "rope_theta": "rope_theta",
    "max_position_embeddings": "max_context_len",
}


@functools.lru_cache(maxsize=None)
def load_config(model_path: str, **overrides) -> EngineConfig:
    """Read the checkpoint's config.json once per (path, overrides)."""
    fields = {}
    cfg_file = os.path.join(model_path, "config.json")
    if os.path.exists(cfg_file):
        with open(cfg_file) as f:
            hf = json.load(f)
        fields = {ours: hf[theirs] for theirs, ours in _HF_KEYS.items() if theirs in hf}
        if "head_dim" in hf:
            fields["head_dim"] = hf["head_dim"]
    fields.update(overrides)
    return EngineConfig(model_path=model_path, **fields)
