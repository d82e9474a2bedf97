"""Server settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List


@dataclass
class RewardSettings:
    num_layers: int = 32
    vocab_size: int = 128256
    hidden_size: int = 4096
    intermediate_size: int = 14336
    num_q_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    # scoring: one ragged prefill over every (prompt, response) pair of the batch
    max_batch_tokens: int = 65536
    max_score_requests: int = 512
    score_mode: str = "scalar"  # "scalar" or "pairwise" (Bradley-Terry margins)
    per_token_rewards: bool = False
    response_segment_id: int = 1
    # critique: a few generated tokens explaining the score, for the requests that ask
    critique_max_tokens: int = 48
    critique_batch_sizes: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32])
    critique_pages: int = 16384
    critique_max_pages_per_req: int = 512
    critique_ws_bytes: int = 96 << 20
    use_trtllm_critique: bool = True
    # fraction of the GPU memory the reward model may use; the policy keeps the rest
    gpu_share: float = 0.35
    eos_token_id: int = 128009

    @property
    def max_critique_bs(self) -> int:
        return max(self.critique_batch_sizes)

    def critique_graph_ws_bytes(self) -> int:
        # split-k partials of the largest critique bucket over the longest context it may read
        chunks = max(1, self.critique_max_pages_per_req // 16)
        return self.max_critique_bs * self.num_q_heads * chunks * (self.head_dim + 1) * 4
