import enum
import os
from dataclasses import dataclass
from typing import Tuple

PAGE_SIZE = 16
WS_MIB = 256
DECODE_BUCKETS: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 48, 64)
_WS_BYTES = {"cascade": 96 << 20, "verify": 64 << 20}
GRAPH_WS_MB = int(os.getenv("FIN_GRAPH_WS_MB", "128"))

assert DECODE_BUCKETS == tuple(sorted(DECODE_BUCKETS))  # ok: FC109


class WsSize(enum.IntEnum):
    PREFILL = 384 << 20
    DECODE = 128 << 20


@dataclass
class ServeLimits:
    num_layers: int = 32
    num_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    max_seqs: int = 64
    max_tokens: int = 16384
    max_pages: int = 262144
    window: int = 8192
    window_every: int = 2
    decode_backend: str = "trtllm-gen"
    window_ws_bytes: int = 64 << 20
    buckets: Tuple[int, ...] = DECODE_BUCKETS

    def split_kv_bytes(self) -> int:
        return self.max_tokens * self.num_heads * (self.head_dim + 2) * 4
