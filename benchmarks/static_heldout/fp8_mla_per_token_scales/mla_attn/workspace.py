import functools

import torch


@functools.lru_cache(maxsize=None)
def get_trtllm_mla_workspace(nbytes: int, device: torch.device) -> torch.Tensor:
    """One workspace shared by every layer's trtllm-gen MLA decode."""
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105


def fa2_prefill_workspace(nbytes: int, device: torch.device) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105
