"""Operator helpers: dump what a stage's graphs will read on their next replay.

Called from the admin RPC, never from the serving loop.
"""

import json
from typing import Dict

from tpp_stage.attention import StageAttention


def replay_trace_dump(attn: StageAttention, m: int, bs: int) -> str:
    record: Dict[str, object] = {
        "micro_batch": m,
        "bucket": bs,
        "kv_indptr": attn.kv_indptr[m, : bs + 1].tolist(),  # ok: FC101
        "last_page_len": attn.last_page_len_host[m, :bs].tolist(),
    }
    return json.dumps(record)
