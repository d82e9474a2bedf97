from __future__ import annotations

import dataclasses
from typing import Tuple

import torch


@dataclasses.dataclass(frozen=True)
class HeadGroup:
    name: str
    window: int  # tokens; -1 means global
    kv_heads: Tuple[int, ...]  # kv head ids in checkpoint order

    @property
    def is_global(self) -> bool:
        return self.window < 0

    @property
    def num_kv_heads(self) -> int:
        return len(self.kv_heads)


def default_groups() -> Tuple[HeadGroup, ...]:
    # the span search assigned heads 0 and 4 to the full context, the rest to two local spans
    return (
        HeadGroup("global", -1, (0, 4)),
        HeadGroup("local4k", 4096, (1, 2, 5, 6)),
        HeadGroup("local1k", 1024, (3, 7)),
    )


@dataclasses.dataclass
class SpanConfig:
    num_layers: int = 32
    hidden_size: int = 4096
    vocab_size: int = 128256
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    num_pages_per_group: int = 32768
    max_running: int = 256
    max_prefill_tokens: int = 8192
    max_context: int = 131072
    graph_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    global_trtllm: bool = False
    groups: Tuple[HeadGroup, ...] = dataclasses.field(default_factory=default_groups)

    @property
    def gqa_ratio(self) -> int:
        return self.num_qo_heads // self.num_kv_heads

    @property
    def max_graph_bs(self) -> int:
        return max(self.graph_buckets)

    @property
    def max_pages_per_req(self) -> int:
        return (self.max_context + self.page_size - 1) // self.page_size

    def max_pages_for(self, grp: HeadGroup) -> int:
        """Pages one request can hold in a group: a local group keeps one page of slack."""
        if grp.is_global:
            return self.max_pages_per_req
        return (grp.window + self.page_size - 1) // self.page_size + 1

    def decode_workspace_bytes(self) -> int:
        return self.max_running * self.num_qo_heads * (self.head_dim * 4 + 4) * 8

    def graph_workspace_bytes(self) -> int:
        return self.max_graph_bs * self.num_qo_heads * (self.head_dim * 4 + 4) * 16 + (4 << 20)

    def global_workspace_bytes(self) -> int:
        heads = self.gqa_ratio * self.groups[0].num_kv_heads
        return self.max_running * heads * (self.head_dim * 4 + 8) * 32 + (8 << 20)


@torch.jit.script
def window_first_pos(seq_lens: torch.Tensor, window: int) -> torch.Tensor:
    """First position still inside a local window for each row."""
    assert window > 0  # ok: FC109
    return torch.clamp(seq_lens - window, min=0)
