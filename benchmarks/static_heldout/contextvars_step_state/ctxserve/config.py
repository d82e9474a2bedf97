"""Limits and workspace sizes."""
from dataclasses import dataclass

GRAPH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64)
assert GRAPH_BUCKETS == tuple(sorted(GRAPH_BUCKETS)), "capture order assumes ascending buckets"  # ok: FC109
# shared system-prompt pages are at most 1k tokens; the cascade prefill never splits further
PREFIX_WS_BYTES = 32 * 1024 * 1024
# trtllm-gen scratch per wrapper in MiB, measured at bs=64 and 32k context
TRTLLM_WS_MB = {"decode": 256, "draft": 64}

@dataclass(frozen=True)
class ServeConfig:
    max_running_requests: int = 64
    chunked_prefill_size: int = 8192
    context_len: int = 32768
    page_size: int = 32
    num_pages: int = 131072
    num_layers: int = 8
    hidden_size: int = 4096
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 151936
    sliding_window: int = 8192
    chunk_size: int = 16384
    system_prompt_len: int = 512
    eos_token_id: int = 151645
    prefill_workspace_bytes: int = 256 << 20
    def __post_init__(self):
        assert self.system_prompt_len % self.page_size == 0, "system prompt must fill whole pages"  # expect: FC109
    def decode_workspace_bytes(self) -> int:
        return max(self.max_running_requests * self.num_qo_heads * (self.head_dim + 1) * 4 * 64, 64 << 20)
