from dataclasses import dataclass

# The ragged graph wrappers share one workspace; sized once for the largest bucket on an A100.
GRAPH_WORKSPACE_BYTES = 128 * 1024 * 1024
PREFIX_PAGE_SIZE = 16


@dataclass
class EmbedConfig:
    max_num_tokens: int = 16384
    max_batch: int = 256
    max_seq_len: int = 8192
    num_heads: int = 16
    num_kv_heads: int = 16
    head_dim: int = 64
    hidden_size: int = 1024
    kv_layout: str = "NHD"
    token_buckets: tuple = (256, 512, 1024, 2048, 4096)
    use_trtllm_context: bool = False
