from __future__ import annotations

from dataclasses import dataclass


def default_workspace_bytes() -> int:
    return 256 * 1024 * 1024


@dataclass(frozen=True)
class WatermarkConfig:
    gamma: float = 0.25          # green fraction of the vocabulary
    delta: float = 2.0           # logit bias added to green tokens
    hash_key: int = 15485863
    num_buckets: int = 4096      # previous-token hash buckets, one green list each
    samples_per_prompt: int = 1


@dataclass(frozen=True)
class EngineLimits:
    max_batch: int = 128
    max_graph_bs: int = 64
    graph_sizes: tuple = (1, 2, 4, 8, 16, 32, 64)
    page_size: int = 16
    num_pages: int = 65536
    max_seq_len: int = 8192
    max_prefill_tokens: int = 16384
    num_layers: int = 32
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    hidden_size: int = 4096
    vocab_size: int = 128256
    eos_token_id: int = 128001
    double_buffer_plans: bool = False
    use_trtllm_context: bool = True

    def decode_workspace_bytes(self) -> int:
        splits = max(1, self.max_seq_len // (self.page_size * 8))
        return self.max_batch * self.num_qo_heads * splits * (self.head_dim + 1) * 4

    def ctx_workspace_bytes(self) -> int:
        return self.max_prefill_tokens * self.num_qo_heads * 4 * 8
