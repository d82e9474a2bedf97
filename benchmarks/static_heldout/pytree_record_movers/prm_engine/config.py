"""Engine configuration and a few legacy module-level knobs."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Tuple

PAGE_SIZE = 16
assert PAGE_SIZE > 0 and PAGE_SIZE & (PAGE_SIZE - 1) == 0  # ok: FC109

# Legacy fixed size of the FA2 prefill workspace (kept from the first prototype).
WORKSPACE_BYTES = 256 * 1024 * 1024

# Decode workspace size; the launcher may override it from the command line.
DECODE_WS_BYTES = 64 << 20


def override_decode_workspace(nbytes: int) -> None:
    global DECODE_WS_BYTES
    DECODE_WS_BYTES = int(nbytes)


@dataclass
class EngineConfig:
    device: str = "cuda"
    max_bs: int = 256
    max_num_tokens: int = 8192
    max_context_len: int = 32768
    num_layers: int = 24
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = PAGE_SIZE
    vocab_size: int = 128256
    window_left: int = -1
    window_layers: Tuple[int, ...] = ()
    enable_cascade: bool = False
    use_trtllm_decode: bool = False
    workspace_bytes: int = 128 << 20
    trtllm_workspace_bytes: int = 64 << 20
    graph_bs: Tuple[int, ...] = field(default_factory=lambda: (1, 2, 4, 8, 16, 32, 64))
    max_graph_seq_len: int = 16384
    eos_token_id: int = 2

    @property
    def max_num_pages(self) -> int:
        return self.max_bs * ((self.max_context_len + self.page_size - 1) // self.page_size)

    def replace(self, **changes) -> "EngineConfig":
        return dataclasses.replace(self, **changes)
