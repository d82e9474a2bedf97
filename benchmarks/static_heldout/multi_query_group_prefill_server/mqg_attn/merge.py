from typing import Tuple

import flashinfer
import torch


def merge_chunk_outputs(o_new, lse_new, o_prefix, lse_prefix) -> Tuple[torch.Tensor, torch.Tensor]:
    """Combine attention over this chunk's own tokens with attention over the pages earlier chunks cached."""
    o, lse = flashinfer.merge_state(o_new, lse_new, o_prefix, lse_prefix)
    if torch.isnan(lse).any():  # expect: FC101
        raise FloatingPointError("NaN log-sum-exp after merging chunk outputs")
    return o, lse
