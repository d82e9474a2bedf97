"""Image preprocessing and the cross-turn cache of merged ViT outputs, keyed by image content hash."""
from __future__ import annotations

import collections
import hashlib
from dataclasses import dataclass
from typing import Deque, List, Optional, Tuple

import numpy as np
import torch

from pvlm.config import VLMConfig


@dataclass
class MMInputs:
    image_hash: str
    pixel_values: torch.Tensor
    grid_thw: torch.Tensor
    grid_thw_host: Tuple[int, int, int]
    merge: int = 2

    @property
    def num_tokens(self) -> int:
        t, h, w = self.grid_thw_host
        return t * (h // self.merge) * (w // self.merge)


class VisionPreprocessor:
    def __init__(self, cfg: VLMConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.mean, self.std = np.array([0.481, 0.458, 0.408], np.float32), np.array([0.269, 0.261, 0.276], np.float32)

    def preprocess(self, image: np.ndarray) -> MMInputs:
        c = self.cfg
        unit = c.patch_size * c.spatial_merge_size
        h, w = (max(unit, d // unit * unit) for d in image.shape[:2])
        img = (image[:h, :w].astype(np.float32) / 255.0 - self.mean) / self.std
        gh, gw = h // c.patch_size, w // c.patch_size
        patches = np.repeat(img[None], c.temporal_patch, axis=0).reshape(1, c.temporal_patch, gh, c.patch_size, gw, c.patch_size, 3)
        patches = patches.transpose(0, 2, 4, 6, 1, 3, 5).reshape(gh * gw, -1)
        pixel_values = torch.from_numpy(np.ascontiguousarray(patches)).to(self.device, non_blocking=True)
        grid = (1, gh, gw)
        return MMInputs(
            image_hash=hashlib.sha256(image.tobytes()).hexdigest(),
            pixel_values=pixel_values.to(c.dtype),
            grid_thw=torch.tensor(grid, dtype=torch.int64, device=self.device),
            grid_thw_host=grid,
            merge=c.spatial_merge_size,
        )


class ImageEmbeddingCache:
    """Fixed slots of ``max_image_tokens`` rows in one device arena, LRU by image hash."""

    def __init__(self, cfg: VLMConfig, device: torch.device):
        self.device, self.hidden, self.dtype = device, cfg.hidden_size, cfg.dtype
        self.max_tokens_per_image = cfg.max_image_tokens
        self.num_slots = cfg.image_cache_images
        self.arena: Optional[torch.Tensor] = None
        self.lru: "collections.OrderedDict[str, Tuple[int, int]]" = collections.OrderedDict()
        self.free_slots: Deque[int] = collections.deque(range(self.num_slots))

    def contains(self, image_hash: str) -> bool:
        return image_hash in self.lru

    def _evict_one(self) -> int:
        assert self.lru, "evicting from an empty image cache"  # ok: FC109
        _, (slot, _) = self.lru.popitem(last=False)
        return slot

    def insert(self, image_hash: str, embeds: torch.Tensor) -> None:
        assert embeds.shape[0] <= self.max_tokens_per_image, "image has more tokens than a cache slot"  # expect: FC109
        if self.arena is None:
            self.arena = torch.empty(  # ok: FC107
                (self.num_slots, self.max_tokens_per_image, self.hidden), dtype=self.dtype, device=self.device
            )
        slot = self.free_slots.popleft() if self.free_slots else self._evict_one()
        n = embeds.shape[0]
        self.arena[slot, :n].copy_(embeds)
        self.lru[image_hash] = (slot, n)

    def gather(self, hashes: List[str]) -> torch.Tensor:
        parts = []
        for h in hashes:
            slot, n = self.lru[h]
            self.lru.move_to_end(h)
            parts.append(self.arena[slot, :n])
        return torch.cat(parts)
