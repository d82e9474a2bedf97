"""Process-wide attention workspaces, one per device and size."""

import functools

import torch

_MiB = 1 << 20


def workspace_bytes_for(*, max_batch_size: int, max_seq_len: int, head_num: int, page_size: int) -> int:
    """Bytes a decode step can need: split-k partial rows (fp32 output + lse) per head, sequence and KV chunk."""
    chunk_tokens = page_size * 16
    max_chunks = (max_seq_len + chunk_tokens - 1) // chunk_tokens
    partials = max_batch_size * head_num * max_chunks * (128 * 4 + 4)
    return max(partials + 16 * _MiB, 32 * _MiB)


@functools.lru_cache(maxsize=None)
def get_zero_workspace(device: torch.device, num_bytes: int) -> torch.Tensor:
    # the trtllm-gen context kernel keeps its tile counters here; they must start at zero
    return torch.zeros(num_bytes, dtype=torch.uint8, device=device)  # ok: FC105


@functools.lru_cache(maxsize=None)
def get_trtllm_gen_workspace(device: torch.device, num_bytes: int) -> torch.Tensor:
    # decode-only scratch; one per device, shared by every layer
    return torch.empty(num_bytes, dtype=torch.uint8, device=device)  # expect: FC105
