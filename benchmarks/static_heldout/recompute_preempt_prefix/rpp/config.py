from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ModelConfig:
    num_layers: int = 32
    hidden_size: int = 4096
    num_q_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 128256
    rope_theta: float = 500000.0
    dtype: str = "bfloat16"


@dataclass
class CacheConfig:
    block_size: int = 16
    num_gpu_blocks: int = 16384
    enable_prefix_caching: bool = True
    # "auto" keeps the model dtype; "fp8" / "fp8_e4m3" stores the KV cache in FP8
    kv_cache_dtype: str = "auto"


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 32768
    # a single prompt never takes more than this many tokens of one step
    long_prefill_token_threshold: int = 2048
    enable_chunked_prefill: bool = True


@dataclass
class EngineConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    cudagraph_capture_sizes: list[int] = field(
        default_factory=lambda: [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256]
    )
    use_trtllm_decode: bool = False
    device: str = "cuda"

    @property
    def max_capture_size(self) -> int:
        return max(self.cudagraph_capture_sizes)
