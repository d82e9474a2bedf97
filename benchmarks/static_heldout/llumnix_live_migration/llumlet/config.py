from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

# bytes of the FlashInfer workspace shared by the decode graphs
GRAPH_WORKSPACE_BYTES = int(os.environ.get("LLUMLET_GRAPH_WORKSPACE_BYTES", 192 << 20))


@dataclass
class InstanceConfig:
    instance_id: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    ffn: int
    vocab_size: int
    block_size: int = 16
    num_blocks: int = 8192
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    graph_buckets: tuple = (1, 2, 4, 8, 16, 32, 64, 128)
    prefill_workspace_bytes: int = 512 << 20
    migration_stage_blocks: int = 64
    last_stage_tokens: int = 32
    sm_version: int = 90
    logits_soft_cap: Optional[float] = None
    softcap_every: int = 0
