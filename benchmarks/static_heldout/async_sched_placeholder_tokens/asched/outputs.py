"""What one runner step hands back to the scheduler and to the output thread."""
from dataclasses import dataclass
from typing import List

import torch


@dataclass
class SamplerOutput:
    sampled_token_ids: torch.Tensor
    is_eos: torch.Tensor
    num_reqs: int


class AsyncOutput:
    def __init__(self, sampled_host: torch.Tensor, num_reqs: int, event: torch.cuda.Event):
        self._sampled_host = sampled_host
        self._num_reqs = num_reqs
        self._event = event

    def get_output(self) -> List[int]:
        # Called by the output thread, never by the step loop.
        self._event.synchronize()  # ok: FC101
        return self._sampled_host[: self._num_reqs].tolist()
