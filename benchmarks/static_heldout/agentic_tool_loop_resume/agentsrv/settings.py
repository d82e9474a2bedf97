"""Server limits of the agent server."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple


@dataclass(frozen=True)
class AgentSettings:
    num_layers: int = 32
    hidden_size: int = 4096
    vocab_size: int = 128256
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    num_pages: int = 65536
    max_batch_size: int = 128
    max_pages_per_req: int = 8192
    max_tool_output_tokens: int = 8192
    max_resume_batch: int = 16
    graph_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    history_window: int = 4096
    park_to_host_after_s: float = 30.0
    use_trtllm: bool = False
    tool_call_start_id: int = 128010
    tool_call_end_id: int = 128011
    eos_id: int = 128001

    def resume_workspace_bytes(self) -> int:
        return self.max_tool_output_tokens * self.num_qo_heads * self.head_dim * 4

    @property
    def max_seq_len(self) -> int:
        return self.max_pages_per_req * self.page_size
