"""Layer layout and server limits of a hybrid linear-attention / full-attention model (Qwen3-Next, Jamba,
MiniMax-style interleaving)."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import List

# Three gated-delta-net layers for every full-attention layer, as in Qwen3-Next.
FULL_ATTENTION_INTERVAL = 4
CONV_KERNEL_SIZE = 4
# A sliding-window layer keeps at most this many pages per request; its decode wrapper gets a workspace of its own.
SWA_WORKSPACE_BYTES = 64 * 1024 * 1024

assert CONV_KERNEL_SIZE in (2, 3, 4), "causal_conv1d supports widths 2..4"  # ok: FC109


class LayerKind(enum.Enum):
    FULL_ATTENTION = "full_attention"
    LINEAR_ATTENTION = "linear_attention"
    SLIDING_ATTENTION = "sliding_attention"


@dataclass
class HybridLayerConfig:
    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    vocab_size: int = 151936
    sliding_window: int = 0
    sliding_every: int = 0
    full_attention_interval: int = FULL_ATTENTION_INTERVAL
    layer_kinds: List[LayerKind] = field(default_factory=list)

    def __post_init__(self):
        if self.layer_kinds:
            return
        kinds = []
        for i in range(self.num_hidden_layers):
            if (i + 1) % self.full_attention_interval == 0:
                kinds.append(LayerKind.FULL_ATTENTION)
            elif self.sliding_every and (i + 1) % self.sliding_every == 0:
                kinds.append(LayerKind.SLIDING_ATTENTION)
            else:
                kinds.append(LayerKind.LINEAR_ATTENTION)
        self.layer_kinds = kinds

    @property
    def full_attention_layer_ids(self) -> List[int]:
        return [i for i, k in enumerate(self.layer_kinds) if k is not LayerKind.LINEAR_ATTENTION]

    @property
    def linear_layer_ids(self) -> List[int]:
        return [i for i, k in enumerate(self.layer_kinds) if k is LayerKind.LINEAR_ATTENTION]

    def layer_kind(self, layer_id: int) -> LayerKind:
        assert 0 <= layer_id < self.num_hidden_layers, layer_id  # expect: FC109
        return self.layer_kinds[layer_id]

    @property
    def conv_state_shape(self):
        conv_dim = 2 * self.linear_key_head_dim * self.num_key_value_heads + self.linear_value_head_dim * self.linear_num_value_heads
        return (conv_dim, CONV_KERNEL_SIZE - 1)

    @property
    def temporal_state_shape(self):
        return (self.linear_num_value_heads, self.linear_key_head_dim, self.linear_value_head_dim)


@dataclass
class ServerArgs:
    max_running_requests: int = 256
    context_length: int = 32768
    chunked_prefill_size: int = 8192
    page_size: int = 1
    cuda_graph_max_bs: int = 160
    mamba_cache_size: int = 512
    decode_attention_backend: str = "flashinfer"  # or "trtllm_mha" on Blackwell
    disable_cuda_graph: bool = False
    mem_fraction_static: float = 0.85
