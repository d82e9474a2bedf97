"""Configuration, engine limits and the per-step batch of the Qwen3-Next hybrid server."""
from __future__ import annotations

import dataclasses
import enum
from typing import TYPE_CHECKING, List, Optional, Tuple

import torch

if TYPE_CHECKING:
    from q3n.attn.gdn import HybridLinearAttnBackend

# Workspace of the full-attention decode wrappers (the eager one and the per-bucket graph wrappers share it).
FULL_ATTN_DECODE_WORKSPACE_BYTES = 256 * 1024 * 1024


@dataclasses.dataclass
class Qwen3NextConfig:
    hidden_size: int = 2048
    intermediate_size: int = 5120
    num_hidden_layers: int = 48
    full_attention_interval: int = 4
    num_attention_heads: int = 16
    num_key_value_heads: int = 2
    head_dim: int = 256
    partial_rotary_factor: float = 0.25
    rope_theta: float = 10_000_000.0
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 32
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_conv_kernel_dim: int = 4
    rms_norm_eps: float = 1e-6
    vocab_size: int = 151936

    def is_full_attention(self, layer_id: int) -> bool:
        return (layer_id + 1) % self.full_attention_interval == 0

    def full_attention_layers(self) -> List[int]:
        return [i for i in range(self.num_hidden_layers) if self.is_full_attention(i)]

    def linear_attention_layers(self) -> List[int]:
        return [i for i in range(self.num_hidden_layers) if not self.is_full_attention(i)]

    @property
    def linear_key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.linear_key_dim + self.linear_value_dim


@dataclasses.dataclass
class EngineLimits:
    max_running_requests: int = 256
    max_num_tokens: int = 16384
    max_context_len: int = 262144
    page_size: int = 16
    num_pages: int = 131072
    cuda_graph_bs: Tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)
    # MTP verify inside the decode graph: tokens per request = num_speculative_tokens + 1
    num_speculative_tokens: int = 0
    use_trtllm_decode: bool = False

    @property
    def max_pages_per_req(self) -> int:
        return (self.max_context_len + self.page_size - 1) // self.page_size


class ForwardMode(enum.IntEnum):
    EXTEND = 1
    DECODE = 2

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE

    def is_extend(self) -> bool:
        return self == ForwardMode.EXTEND


@dataclasses.dataclass
class ScheduledBatch:
    """What the scheduler hands the model runner each step (host side, plus the KV slots it reserved)."""

    forward_mode: ForwardMode
    input_ids_cpu: torch.Tensor
    positions_cpu: torch.Tensor
    req_pool_indices_cpu: torch.Tensor
    seq_lens_cpu: torch.Tensor
    out_cache_loc: torch.Tensor
    new_req_pool_indices_cpu: torch.Tensor
    finished_req_pool_indices_cpu: torch.Tensor
    extend_seq_lens_cpu: Optional[List[int]] = None
    extend_prefix_lens_cpu: Optional[List[int]] = None
    num_output_ids: int = 0
    output_ready: Optional[torch.cuda.Event] = None


@dataclasses.dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    mamba_slots: torch.Tensor
    out_cache_loc: torch.Tensor
    attn_backend: "HybridLinearAttnBackend"
    extend_seq_lens: Optional[torch.Tensor] = None
    extend_prefix_lens: Optional[torch.Tensor] = None
    extend_seq_lens_cpu: Optional[List[int]] = None
    tokens_per_req: int = 1
