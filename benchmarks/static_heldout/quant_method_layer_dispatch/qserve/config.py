"""Engine and model configuration."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch


@dataclass
class ModelConfig:
    architecture: str
    model_path: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    max_model_len: int
    head_dim: Optional[int] = None
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    # Mistral-style models apply one window to every layer.
    sliding_window: Optional[int] = None
    torch_dtype: torch.dtype = torch.bfloat16
    quantization: Optional[str] = None
    quantization_config: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads

    def max_blocks_per_seq(self, block_size: int) -> int:
        return -(-self.max_model_len // block_size)


@dataclass
class EngineConfig:
    device: str = "cuda"
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    block_size: int = 16
    kv_cache_dtype: str = "auto"
    # Recompute fp8 KV scales from every step's keys and values instead of the checkpoint's.
    calculate_kv_scales: bool = False
    enforce_eager: bool = False
    cuda_graph_sizes: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 128, 256])
    # trtllm-gen decode kernels (Blackwell); models with a sliding window stay on FA2.
    use_trtllm_decode: bool = False
    flashinfer_workspace_bytes: int = 256 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.kv_cache_dtype not in ("auto", "fp8", "fp8_e4m3"):
            raise ValueError(f"unsupported kv_cache_dtype {self.kv_cache_dtype!r}")
