from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ModelConfig:
    num_layers: int = 30
    hidden_size: int = 4096
    num_heads: int = 32
    vocab_size: int = 250880
    uses_alibi: bool = True
    train_len: int = 2048
    layer_norm_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


@dataclass
class ServerArgs:
    tp_rank: int = 0
    tp_size: int = 1
    max_running_requests: int = 160
    max_context_len: int = 8192
    max_prefill_tokens: int = 16384
    cuda_graph_max_bs: int = 96
    alibi_window: bool = False
    chunked_prefill_size: int = 4096

    def decode_workspace_bytes(self, num_heads: int, head_dim: int) -> int:
        splits = max(1, self.max_context_len // 256)
        return self.max_running_requests * num_heads * splits * (head_dim + 1) * 4

    def prefill_workspace_bytes(self, num_heads: int, head_dim: int) -> int:
        return self.max_prefill_tokens * num_heads * (head_dim + 1) * 4 * 2
