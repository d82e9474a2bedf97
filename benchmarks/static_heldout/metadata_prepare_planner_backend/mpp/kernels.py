import torch


@torch.jit.script
def last_page_lens(seq_lens: torch.Tensor, page_size: int) -> torch.Tensor:
    assert page_size > 0  # ok: FC109
    return torch.remainder(seq_lens - 1, page_size) + 1


def pages_needed(seq_lens_np, page_size: int):
    return (seq_lens_np + page_size - 1) // page_size
