"""Pooling of the embedding requests' hidden states."""
import torch
import torch.nn.functional as F

from egm.kernels.segment_pool import segment_mean


class Pooler:
    def __init__(self, mode: str, normalize: bool, scratch_i32: torch.Tensor):
        assert mode in ("mean", "last", "cls")  # expect: FC109
        self.mode = mode
        self.normalize = normalize
        # an int32 buffer the engine already keeps; saves an allocation per step
        self.scratch_i32 = scratch_i32

    def pool(self, hidden: torch.Tensor, cu_seqlens: torch.Tensor, num_segments: int) -> torch.Tensor:
        if self.mode == "last":
            idx = self.scratch_i32[:num_segments]
            torch.sub(cu_seqlens[1:], 1, out=idx)  # expect: FC104
            out = hidden.index_select(0, idx).float()
        elif self.mode == "cls":
            out = hidden.index_select(0, cu_seqlens[:-1]).float()
        else:
            out = segment_mean(hidden, cu_seqlens, num_segments)
        return F.normalize(out, dim=-1) if self.normalize else out
