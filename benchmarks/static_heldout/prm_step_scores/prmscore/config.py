from __future__ import annotations

from dataclasses import dataclass

# scratch of the eager candidate prefill, sized for the largest batch we benchmarked
SCORE_WS_BYTES = 64 << 20


@dataclass
class ScoreConfig:
    num_layers: int = 32
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    vocab_size: int = 128256
    step_tag_id: int = 12902
    max_candidates: int = 64
    max_num_tokens: int = 32768
    max_pages: int = 65536
    graph_token_buckets: tuple = (256, 512, 1024, 2048)
    graph_max_cands: int = 16
    workspace_bytes: int = 384 << 20
    num_score_labels: int = 2
