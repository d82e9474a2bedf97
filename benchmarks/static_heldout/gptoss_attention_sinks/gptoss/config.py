from dataclasses import dataclass
from enum import Enum
from typing import Tuple


class LayerType(str, Enum):
    FULL = "full"
    SLIDING = "sliding"


@dataclass
class GptOssConfig:
    num_layers: int = 24
    hidden_size: int = 2880
    num_attention_heads: int = 64
    num_kv_heads: int = 8
    head_dim: int = 64
    vocab_size: int = 201088
    sliding_window: int = 128
    num_experts: int = 32
    experts_per_token: int = 4
    intermediate_size: int = 2880
    page_size: int = 16
    num_pages: int = 131072
    max_batch_size: int = 256
    max_num_tokens: int = 8192
    cuda_graph_bs: Tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
    sm_version: int = 90

    def layer_type(self, layer_id: int) -> LayerType:
        # even layers are banded (sliding window), odd layers attend to the full context
        return LayerType.SLIDING if layer_id % 2 == 0 else LayerType.FULL

    @property
    def window_pages(self) -> int:
        return (self.sliding_window + self.page_size - 1) // self.page_size + 1
