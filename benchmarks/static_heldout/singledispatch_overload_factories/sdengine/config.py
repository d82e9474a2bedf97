"""Engine configuration: one frozen dataclass per attention path; workspaces and backends dispatch on the class."""
import dataclasses

PAGE_SIZE = 16
DECODE_BUCKETS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
FLOAT_WORKSPACE_BYTES = 256 * 1024 * 1024  # FA2 split-k partials of the eager decode wrapper
assert PAGE_SIZE & (PAGE_SIZE - 1) == 0, "page size must be a power of two"  # ok: FC109


graph_workspace_bytes = lambda: 96 * 1024 * 1024  # noqa: E731  (sized by hand for the 128-row bucket)


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = PAGE_SIZE
    max_batch_size: int = 128
    max_num_tokens: int = 8192
    max_pages: int = 65536
    float_workspace_bytes: int = 128 * 1024 * 1024
    sliding_window: int = 4096


@dataclasses.dataclass(frozen=True)
class DecodeConfig(AttentionConfig):
    buckets: tuple[int, ...] = DECODE_BUCKETS


@dataclasses.dataclass(frozen=True)
class PrefillConfig(AttentionConfig):
    causal: bool = True


@dataclasses.dataclass(frozen=True)
class TrtllmConfig(AttentionConfig):
    max_seq_len: int = 32768
    num_draft_tokens: int = 3

    @property
    def workspace_bytes(self) -> int:  # counters and multi-CTA partials per (row, head) of the largest batch
        return self.max_batch_size * self.num_qo_heads * 64 * 1024


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    decode: DecodeConfig = dataclasses.field(default_factory=DecodeConfig)
    prefill: PrefillConfig = dataclasses.field(default_factory=PrefillConfig)
    trtllm: TrtllmConfig = dataclasses.field(default_factory=TrtllmConfig)
    use_trtllm_decode: bool = False
    use_cuda_graph: bool = True
    vocab_size: int = 128256
