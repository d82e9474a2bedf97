"""Page arithmetic shared by the metadata builder and the backend (host or device tensors)."""

import torch


def page_counts(seq_lens: torch.Tensor, page_size: int) -> torch.Tensor:
    return (seq_lens + page_size - 1) // page_size


def last_page_lens(seq_lens: torch.Tensor, page_size: int) -> torch.Tensor:
    return (seq_lens - 1) % page_size + 1
