"""Limits of the agent-serving engine (fork/join of tool-calling branches)."""

from dataclasses import dataclass
from typing import Tuple

# Two-level cascade: the conversation prefix shared by every branch of a fork, then
# each branch's own suffix (tool call arguments, tool results, its own reasoning).
CASCADE_LEVELS = 2
CASCADE_WORKSPACE_BYTES = 256 * 1024 * 1024

BRANCH_FREE = 0
BRANCH_RUNNING = 1
BRANCH_WAITING_TOOL = 2
BRANCH_JOINED = 3

TOOL_CALL_END = 128013


@dataclass
class AgentServeConfig:
    num_layers: int = 32
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    hidden_size: int = 4096
    vocab_size: int = 128256
    rope_theta: float = 500000.0
    page_size: int = 16
    num_pages: int = 65536
    num_spare_pages: int = 1024
    max_branches: int = 256
    max_fanout: int = 16
    max_step_tokens: int = 4096
    max_pages_per_branch: int = 2048
    decode_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    long_context_threshold: int = 32768
    trtllm_workspace_bytes: int = 128 * 1024 * 1024
    split_kv_chunks: int = 16

    @property
    def max_graph_bs(self) -> int:
        return max(self.decode_buckets)

    def decode_workspace_bytes(self) -> int:
        # split-k partial outputs and their LSEs for the largest decode batch
        per_row = self.num_qo_heads * self.split_kv_chunks * (self.head_dim + 1) * 4
        return self.max_branches * per_row + (16 << 20)
