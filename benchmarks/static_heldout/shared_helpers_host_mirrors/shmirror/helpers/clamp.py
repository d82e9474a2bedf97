"""Length clamps."""

import numpy as np
import torch


def clamp_lens(lens, hi):
    if isinstance(lens, np.ndarray):
        return np.minimum(lens, hi)
    return torch.clamp(lens, max=hi)


def clamp_lens_(lens, lo, hi):
    """Clamp a length buffer in place (padding rows included)."""
    return lens.clamp_(min=lo, max=hi)


def check_lens(lens, limit):
    if (lens > limit).any():  # expect: FC101
        raise ValueError(f"a sequence is longer than the limit {limit}")
    return lens
