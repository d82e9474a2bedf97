import os
from dataclasses import dataclass

# Float workspace for the FlashInfer planner, in MiB.
FWD_WS_MB = int(os.environ.get("FWD_WS_MB", "256"))
GRAPH_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)


@dataclass(frozen=True)
class EngineConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 32768
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    max_pages: int = 1 << 16
