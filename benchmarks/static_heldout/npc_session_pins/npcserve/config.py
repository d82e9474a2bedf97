from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class NPCServerConfig:
    max_sessions: int = 8192
    max_active: int = 256          # sessions decoded in one tick
    graph_max_bs: int = 128        # larger ticks run eagerly
    bucket_sizes: tuple = (8, 16, 32, 64, 128)
    page_size: int = 16
    num_pages: int = 131072
    persona_pages_max: int = 96
    dialogue_pages_max: int = 8
    max_context: int = 1664
    max_line_tokens: int = 96
    num_layers: int = 24
    num_qo_heads: int = 16
    num_kv_heads: int = 4
    head_dim: int = 128
    hidden_size: int = 2048
    vocab_size: int = 32000
    num_emotes: int = 12
    persona_recall_every: int = 6  # every n-th layer re-reads the persona pages only
    use_trtllm_decode: bool = False
    trace_ticks: bool = False
    eos_ids: list = field(default_factory=lambda: [2])

    @property
    def max_pages_per_session(self) -> int:
        return self.persona_pages_max + self.dialogue_pages_max

    def decode_workspace_bytes(self) -> int:
        # split-k partial outputs and LSE for every active row and head, fp32
        max_splits = max(1, self.max_context // (self.page_size * 4))
        return self.max_active * self.num_qo_heads * max_splits * (self.head_dim + 1) * 4

    def prefill_workspace_bytes(self) -> int:
        tokens = self.max_active * self.max_line_tokens
        return tokens * self.num_qo_heads * (self.head_dim + 1) * 4 * 2
