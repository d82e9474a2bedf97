from __future__ import annotations

import torch

from ..model_executor.forward_batch_info import ForwardBatch


class TpModelWorker:
    def __init__(self, model_runner) -> None:
        self.model_runner = model_runner

    def forward_batch_generation(self, fb: ForwardBatch) -> torch.Tensor:
        return self.model_runner.forward(fb).argmax(dim=-1)
