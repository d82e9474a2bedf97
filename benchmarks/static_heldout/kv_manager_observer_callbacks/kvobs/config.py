"""Server configuration and the constants the KV manager and the attention backend share."""
import enum
from dataclasses import dataclass
from typing import Tuple

PAGE_SIZE = 16
PREFILL_WS_MB = 256
DECODE_BUCKETS: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
assert DECODE_BUCKETS == tuple(sorted(DECODE_BUCKETS))  # ok: FC109


class WsSize(enum.IntEnum):
    RAGGED = 64 << 20
    GRAPH = 192 << 20


@dataclass(frozen=True)
class ServerConfig:
    num_layers: int = 24
    num_draft_layers: int = 0
    num_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 32000
    num_pages: int = 16384
    max_running: int = 64
    max_context: int = 32768
    sliding_window: int = 4096
    window_layers: Tuple[int, ...] = ()
    softcap_layers: Tuple[int, ...] = ()
    logits_soft_cap: float = 30.0
    shared_prefix_pages: int = 0
    use_trtllm_decode: bool = False
    decode_workspace_bytes: int = 256 << 20
    compact_threshold: float = 0.5
