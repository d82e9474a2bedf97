from dataclasses import dataclass


@dataclass(frozen=True)
class SpecConfig:
    max_batch_size: int = 32
    num_draft_tokens: int = 4
    max_draft_tokens: int = 8
    page_size: int = 16
    max_seq_len: int = 4096
    draft_layers: int = 2
    target_layers: int = 8
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    hidden: int = 4096
    vocab_size: int = 32000
    graph_batch_sizes: tuple = (1, 2, 4, 8, 16, 32)
    kv_layout: str = "NHD"
    sm_major: int = 9

    @property
    def verify_width(self) -> int:
        return self.num_draft_tokens + 1

    @property
    def max_pages_per_seq(self) -> int:
        return (self.max_seq_len + self.max_draft_tokens + self.page_size) // self.page_size

    @property
    def max_total_pages(self) -> int:
        return self.max_batch_size * self.max_pages_per_seq

    def draft_workspace_bytes(self) -> int:
        chunks = max(1, self.max_seq_len // 512)
        return self.max_batch_size * self.num_qo_heads * chunks * (self.head_dim + 1) * 4 + (8 << 20)

    def extend_workspace_bytes(self) -> int:
        rows = self.max_batch_size * self.verify_width
        chunks = max(1, self.max_seq_len // 1024)
        return rows * self.num_qo_heads * chunks * (self.head_dim + 1) * 4 + (8 << 20)
