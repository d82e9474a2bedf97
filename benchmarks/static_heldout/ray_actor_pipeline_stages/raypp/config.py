from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch

HEADER_BYTES = 64


@dataclass(frozen=True)
class StageSpec:
    stage_id: int
    first_layer: int
    last_layer: int
    num_stages: int

    @property
    def is_first(self) -> bool:
        return self.stage_id == 0

    @property
    def is_last(self) -> bool:
        return self.stage_id == self.num_stages - 1


@dataclass
class PipelineConfig:
    num_layers: int = 48
    num_stages: int = 4
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 32000
    intermediate_size: int = 11008
    page_size: int = 16
    max_pages: int = 65536
    max_seq_len: int = 16384
    microbatch_buckets: Tuple[int, ...] = (4, 8, 16, 32)
    local_every: int = 2
    sliding_window: int = 2048
    max_inflight: int = 4
    hidden_clip: Optional[float] = 6.0e4
    kv_layout: str = "NHD"
    dtype: torch.dtype = torch.bfloat16
    device: str = "cuda"

    @property
    def hidden_size(self) -> int:
        return self.num_qo_heads * self.head_dim

    @property
    def max_bucket(self) -> int:
        return max(self.microbatch_buckets)

    def channel_bytes(self) -> int:
        payload = self.max_bucket * self.hidden_size * 2
        return HEADER_BYTES + (payload + 4095) // 4096 * 4096

    def graph_workspace_bytes(self) -> int:
        return self.max_bucket * self.num_qo_heads * (self.max_seq_len // self.page_size) * 16

    def overflow_workspace_bytes(self) -> int:
        return 4 * self.max_bucket * self.num_qo_heads * (self.max_seq_len // self.page_size) * 16

    def stage_specs(self) -> List[StageSpec]:
        per = self.num_layers // self.num_stages
        return [StageSpec(s, s * per, (s + 1) * per, self.num_stages) for s in range(self.num_stages)]
