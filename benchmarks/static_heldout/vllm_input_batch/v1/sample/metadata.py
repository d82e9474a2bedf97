from dataclasses import dataclass, field
from typing import Optional

import torch


@dataclass
class SamplingMetadata:
    temperature: torch.Tensor
    all_greedy: bool
    top_k: Optional[torch.Tensor]
    top_p: Optional[torch.Tensor]
    top_k_cpu: Optional[torch.Tensor] = None
    output_token_ids: list = field(default_factory=list)

    def __post_init__(self):
        assert self.temperature.dim() == 1  # ok: FC109
        if self.top_k is None:
            self.top_k_cpu = None
