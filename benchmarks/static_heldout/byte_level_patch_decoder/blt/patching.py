"""Grouping bytes into patches; device and host views of the patch layout."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import numpy as np
import torch

from .entropy import EntropyPatcher


@dataclass
class PatchBatch:
    byte_ids: torch.Tensor  # [B, L] on the device
    patch_starts: torch.Tensor  # [B, L] bool, on the device
    patch_lens: torch.Tensor  # [N] bytes per patch, on the device
    patches_per_seq: torch.Tensor  # [B] on the device
    patch_lens_cpu: torch.Tensor  # pinned mirror of patch_lens
    patches_per_seq_cpu: torch.Tensor
    num_patches: int

    @property
    def batch_size(self) -> int:
        return self.byte_ids.shape[0]

    @property
    def bytes_per_seq(self) -> int:
        return self.byte_ids.shape[1]


def _lens_from_starts(starts_np: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    per_seq = starts_np.sum(axis=1).astype(np.int32)
    lens = []
    for row in starts_np:
        idx = np.flatnonzero(row)
        ends = np.append(idx[1:], row.shape[0])
        lens.extend((ends - idx).tolist())
    return np.asarray(lens, dtype=np.int32), per_seq


def group_patches(byte_ids: torch.Tensor, patcher: EntropyPatcher, device: torch.device) -> PatchBatch:
    """Runs the entropy model once per prefill and lays the patches out."""
    assert byte_ids.dim() == 2, "expected [batch, bytes]"  # expect: FC109
    starts = patcher.boundaries(byte_ids)
    lens_np, per_seq_np = _lens_from_starts(starts.cpu().numpy())
    lens_cpu = torch.from_numpy(lens_np).pin_memory()
    per_seq_cpu = torch.from_numpy(per_seq_np).pin_memory()
    return PatchBatch(
        byte_ids=byte_ids,
        patch_starts=starts,
        patch_lens=lens_cpu.to(device, non_blocking=True),
        patches_per_seq=per_seq_cpu.to(device, non_blocking=True),
        patch_lens_cpu=lens_cpu,
        patches_per_seq_cpu=per_seq_cpu,
        num_patches=int(lens_np.shape[0]),
    )


def byte_to_patch_index(patch_lens: torch.Tensor) -> torch.Tensor:
    """Patch index of every byte, used by the local encoder's pooling."""
    ids = torch.arange(patch_lens.shape[0], device=patch_lens.device)
    return torch.repeat_interleave(ids, patch_lens)  # expect: FC101


def cu_patches(counts: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(counts.shape[0] + 1, dtype=torch.int32, device=counts.device)
    out[1:] = torch.cumsum(counts, 0)
    return out
