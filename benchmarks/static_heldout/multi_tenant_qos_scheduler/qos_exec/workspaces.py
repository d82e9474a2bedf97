import torch

_WS_MIB = {"decode": 128, "prefill": 512}


def prefill_workspace(device: torch.device) -> torch.Tensor:
    return torch.zeros(_WS_MIB["prefill"] << 20, dtype=torch.uint8, device=device)  # expect: FC106


def decode_workspace(max_batch_size: int, num_qo_heads: int, head_dim: int, device: torch.device) -> torch.Tensor:
    nbytes = max_batch_size * num_qo_heads * (head_dim + 1) * 4 * 32
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105
