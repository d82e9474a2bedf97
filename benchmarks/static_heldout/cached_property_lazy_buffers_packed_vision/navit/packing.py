"""Batch containers. NaViT packing: every image keeps its native resolution and becomes one ragged segment."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import torch

from navit.config import MERGE_SIZE, PATCH_SIZE


@dataclass
class PackedImages:
    patches: torch.Tensor  # [total_patches, 3 * PATCH_SIZE**2]
    grid_thw: torch.Tensor  # [num_images, 3]: frames, patch rows, patch cols
    grid_thw_cpu: torch.Tensor
    cu_seqlens: torch.Tensor  # [num_images + 1] patch offsets
    cu_seqlens_cpu: torch.Tensor
    pos_ids: Optional[torch.Tensor] = None

    @functools.cached_property
    def num_patches(self) -> int:
        return int(self.cu_seqlens_cpu[-1])  # ok: FC101

    @property
    def max_seqlen(self) -> int:
        return int((self.cu_seqlens[1:] - self.cu_seqlens[:-1]).max())  # expect: FC101

    @functools.cached_property
    def tokens_per_image(self) -> torch.Tensor:
        t, h, w = self.grid_thw.unbind(-1)
        return t * h * w // (MERGE_SIZE * MERGE_SIZE)

    @functools.cached_property
    def tokens_per_image_cpu(self) -> np.ndarray:
        return (self.grid_thw_cpu.prod(-1) // (MERGE_SIZE * MERGE_SIZE)).numpy()


def pack_images(images: List[np.ndarray], device: torch.device) -> PackedImages:
    assert images and all(im.ndim == 3 for im in images), "expected HWC images"  # expect: FC109
    grids, chunks = [], []
    for im in images:
        h, w = im.shape[0] // PATCH_SIZE // MERGE_SIZE * MERGE_SIZE, im.shape[1] // PATCH_SIZE // MERGE_SIZE * MERGE_SIZE
        p = im[: h * PATCH_SIZE, : w * PATCH_SIZE].reshape(h, PATCH_SIZE, w, PATCH_SIZE, 3).transpose(0, 2, 4, 1, 3)
        chunks.append(p.reshape(h * w, -1))
        grids.append((1, h, w))
    grid_cpu = torch.tensor(grids, dtype=torch.int32)
    cu_cpu = torch.from_numpy(np.concatenate([[0], np.cumsum(grid_cpu.prod(-1).numpy())]).astype(np.int32))
    patches = torch.from_numpy(np.concatenate(chunks).astype(np.float32)).pin_memory().to(device, non_blocking=True)
    return PackedImages(patches, grid_cpu.to(device, non_blocking=True), grid_cpu, cu_cpu.to(device, non_blocking=True), cu_cpu)


@dataclass
class LMBatch:
    is_decode: bool
    batch_size: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    slots: torch.Tensor
    slots_cpu: torch.Tensor
    out_cache_loc: torch.Tensor
    extend_lens: Optional[torch.Tensor] = None
    extend_lens_cpu: Optional[torch.Tensor] = None
    qo_indptr: Optional[torch.Tensor] = None
    graph_bs: Optional[int] = None
