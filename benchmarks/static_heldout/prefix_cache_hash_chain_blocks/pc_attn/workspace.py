"""Workspace factories for the attention backend."""
import torch


def fa2_workspace(nbytes: int, device: torch.device) -> torch.Tensor:
    """Workspace of the FA2 paged prefill: its planner writes what the kernel reads."""
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105
