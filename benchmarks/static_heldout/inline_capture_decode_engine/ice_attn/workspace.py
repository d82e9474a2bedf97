"""Workspace factories for the decode wrappers."""
import torch


def graph_decode_workspace(nbytes: int, device: torch.device) -> torch.Tensor:
    # shared by the FA2 graph-mode buckets and the FA2 sliding-window wrapper
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105


def eager_decode_workspace(nbytes: int, device: torch.device) -> torch.Tensor:
    # the eager decode wrapper runs trtllm-gen when the config asks for it
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105
