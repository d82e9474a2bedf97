from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class QuantLimits:
    num_layers: int = 40
    num_qo_heads: int = 40
    num_kv_heads: int = 8
    head_dim: int = 128
    hidden_size: int = 5120
    page_size: int = 32
    num_pages: int = 200_000
    max_pages_per_req: int = 1024
    graph_buckets: tuple = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    max_batch_size: int = 256  # every decode batch replays a graph
    max_kv_splits: int = 16
    kv_format: str = "nvfp4"  # "nvfp4" (Blackwell) or "fp8"
    fp8_block_scaled: bool = False  # FP8 with one scale per page: FA2 needs the pages dequantized
    prefer_wrappers: bool = False  # FP8 on Blackwell through the wrapper API instead of trtllm-gen
    rescale_interval: int = 256
