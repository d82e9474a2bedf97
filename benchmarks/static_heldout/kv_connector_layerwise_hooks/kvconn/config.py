"""Connector and engine configuration."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Tuple

# Float workspace of the captured decode graphs, in MiB (tuned on the 8B decode benchmark).
GRAPH_WORKSPACE_MB = 256


@dataclass
class ConnectorConfig:
    role: str = "consumer"            # "producer" (prefill node) or "consumer" (decode node)
    engine_id: str = "decode-0"
    transfer_backend: str = "nixl"
    num_layers: int = 32
    block_size: int = 16
    num_kv_heads: int = 8
    head_dim: int = 128
    remote_layout: str = "NHD"
    staging_blocks: int = 1024
    save_capacity_tokens: int = 16384


@dataclass
class EngineConfig:
    hidden_size: int = 4096
    vocab_size: int = 128256
    num_layers: int = 32
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    num_pages: int = 65536
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 32768
    max_pages_per_seq: int = 2048
    cuda_graph_sizes: Tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
    long_context_threshold: int = 8192
    cascade_min_prefix_pages: int = 8
    connector: ConnectorConfig = field(default_factory=ConnectorConfig)

    def prefill_workspace_bytes(self) -> int:
        # split-k partial outputs and LSEs of the largest chunk, fp32
        per_token = self.num_qo_heads * (self.head_dim + 1) * 4
        return max(self.max_num_batched_tokens * per_token * 2, 64 << 20)

    def decode_workspace_bytes(self) -> int:
        # up to 16 kv chunks per sequence
        per_seq = self.num_qo_heads * (self.head_dim + 1) * 4 * 16
        return max(self.max_num_seqs * per_seq, 32 << 20)

    def trtllm_workspace_bytes(self) -> int:
        return self.max_num_seqs * self.num_qo_heads * 4096 + (16 << 20)
