from typing import Tuple

import flashinfer
import torch


def pack_tree_mask(mask_stage: torch.Tensor, seg_lens: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Pack each request's flattened tree mask into little-endian bits, byte-aligned per request, as
    FlashInfer's prefill wrappers expect in `packed_custom_mask`. `mask_stage` is an oversized staging buffer."""
    indptr = torch.zeros(seg_lens.numel() + 1, dtype=torch.int32, device=seg_lens.device)
    torch.cumsum(seg_lens, 0, out=indptr[1:])
    packed, packed_indptr = flashinfer.segment_packbits(mask_stage[: indptr[-1]], indptr, bitorder="little")  # expect: FC101
    return packed, packed_indptr
