"""Serving limits, plan-pool sizing and the workspace table."""
import enum
from dataclasses import dataclass

DECODE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 96, 128)
assert all(a < b for a, b in zip(DECODE_BUCKETS, DECODE_BUCKETS[1:])), "buckets must be ascending"  # ok: FC109

# per-kind workspace megabytes, tuned once on an H100 box
_WS_MB = {"window": 96, "cascade": 64}


_prefill_ws_bytes = lambda: 192 << 20  # paged prefill never exceeds max_prefill_tokens on one box


class WsSize(enum.IntEnum):
    RAGGED = 128 << 20
    VERIFY = 48 << 20


@dataclass(frozen=True)
class ServeConfig:
    max_batch_size: int = 128
    max_prefill_tokens: int = 16384
    max_model_len: int = 32768
    num_layers: int = 8
    window_layers: tuple = (1, 3, 5, 7)
    sliding_window: int = 4096
    softcap_layers: tuple = (0,)
    logits_soft_cap: float = 30.0
    num_draft_tokens: int = 0
    num_qo_heads: int = 64
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 32
    num_pages: int = 131072
    vocab_size: int = 32000
    decode_backend: str = "fa2"
    softcap_workspace_bytes: int = 64 << 20
    device: str = "cuda"

    @property
    def max_pages_per_seq(self) -> int:
        return -(-self.max_model_len // self.page_size)

    def split_kv_workspace_bytes(self) -> int:
        # fp32 partial o + lse per (row, head, kv chunk) for the largest decode batch, plus index arrays
        return self.max_batch_size * self.num_qo_heads * 32 * (self.head_dim + 1) * 4 + (8 << 20)
