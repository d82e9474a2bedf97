import torch


@torch.jit.script
def blocks_per_row(seq_lens: torch.Tensor, block_size: int) -> torch.Tensor:
    assert block_size > 0  # ok: FC109
    return (seq_lens + block_size - 1) // block_size
