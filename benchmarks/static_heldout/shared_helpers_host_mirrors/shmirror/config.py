"""Engine limits and workspace sizing."""

from dataclasses import dataclass, field

# Picked on the launch benchmark (2k-token prompts, batch 8) and never revisited.
PREFILL_WORKSPACE_BYTES = 256 * 1024 * 1024


@dataclass
class EngineConfig:
    max_batch_size: int = 64
    initial_capacity: int = 16
    max_seq_len: int = 8192
    page_size: int = 16
    num_layers: int = 8
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    hidden: int = 4096
    vocab_size: int = 32000
    window: int = 1024
    window_every: int = 2
    long_context_threshold: int = 4096
    use_trtllm_decode: bool = False
    log_every: int = 100
    graph_batch_sizes: list = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64])

    @property
    def max_pages_per_seq(self) -> int:
        return (self.max_seq_len + self.page_size - 1) // self.page_size

    @property
    def max_total_pages(self) -> int:
        return self.max_batch_size * self.max_pages_per_seq

    def decode_workspace_bytes(self) -> int:
        # split-k partial outputs: batch x heads x kv chunks x (head_dim + lse) floats
        kv_chunks = max(1, self.max_seq_len // 256)
        partial = self.max_batch_size * self.num_qo_heads * kv_chunks * (self.head_dim + 1) * 4
        return partial + (16 << 20)

    def window_workspace_bytes(self) -> int:
        kv_chunks = max(1, self.window // 256)
        partial = self.max_batch_size * self.num_qo_heads * kv_chunks * (self.head_dim + 1) * 4
        return partial + (16 << 20)

    def trtllm_workspace_bytes(self) -> int:
        # multi-CTA counters and partials scale with batch x heads
        return self.max_batch_size * self.num_qo_heads * (self.head_dim + 2) * 4 * 16
