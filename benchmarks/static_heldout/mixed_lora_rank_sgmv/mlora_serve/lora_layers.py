"""LoRA-augmented projections: base GEMM plus SGMV shrink / expand over the batch's adapter segments."""
import torch
from torch import nn

from mlora.adapters import AdapterSlotTable
from mlora.segments import SegmentInfo
from mlora_serve.kernels.sgmv import sgmv_expand, sgmv_shrink


class LoraLinear(nn.Module):
    def __init__(self, base: nn.Linear, slots: AdapterSlotTable, layer_id: int, max_tokens: int):
        super().__init__()
        self.base = base
        self.slots = slots
        self.layer_id = layer_id
        self.max_tokens = max_tokens

    def forward(self, x: torch.Tensor, info: SegmentInfo) -> torch.Tensor:
        y = self.base(x)
        if info.max_rank == 0:
            return y
        if getattr(self, "_shrink_buf", None) is None:
            self._shrink_buf = torch.empty(self.max_tokens, self.slots.max_rank, dtype=x.dtype, device=x.device)  # ok: FC107
        shrink = self._shrink_buf[: x.shape[0], : info.max_rank]
        sgmv_shrink(x, self.slots.lora_a[self.layer_id], info.seg_indptr, info.weight_indices, shrink, info.num_tokens)
        sgmv_expand(shrink, self.slots.lora_b[self.layer_id], self.slots.slot_scalings, info.seg_indptr, info.weight_indices, y, info.num_tokens)
        return y
