"""CUDA graphs of the vision tower, one per image-count bucket."""

import logging
from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np
import torch

from vlm import ImageInputs, VLMConfig
from vt_graphs.vision_tower import VisionTower

logger = logging.getLogger(__name__)


@dataclass
class VisionGraph:
    graph: torch.cuda.CUDAGraph
    num_images: int
    static_out: torch.Tensor


class VisionGraphRunner:
    def __init__(self, tower: VisionTower, cfg: VLMConfig, pool=None):
        buckets = cfg.image_buckets
        assert buckets == sorted(buckets), "image buckets must be ascending"  # expect: FC109
        self.tower = tower
        self.cfg = cfg
        self.buckets: List[int] = list(buckets)
        self.device = cfg.device
        self.pool = pool
        self.graphs: Dict[int, VisionGraph] = {}
        max_patches = self.buckets[-1] * cfg.patches_per_image
        self.static_pixels = torch.zeros(max_patches, cfg.patch_dim, dtype=torch.bfloat16, device=self.device)
        self.cu_seqlens_host = torch.zeros(self.buckets[-1] + 1, dtype=torch.int32, pin_memory=True)
        self._cu = self.cu_seqlens_host.numpy()
        self.patch_scratch: Optional[torch.Tensor] = None

    def _bucket_for(self, num_images: int) -> int:
        for b in self.buckets:
            if b >= num_images:
                return b
        raise ValueError(f"{num_images} images exceed the largest vision bucket {self.buckets[-1]}")

    def _set_cu_seqlens(self, n: int, counts: List[int]) -> None:
        self._cu[0] = 0
        self._cu[1 : n + 1] = np.cumsum(np.asarray(counts, dtype=np.int32))

    def _check_captured(self) -> None:
        assert self.graphs, "capture_vision_buckets() must run before the first image"  # ok: FC109

    def capture_vision_buckets(self) -> None:
        torch.cuda.synchronize()  # ok: FC101
        per_image = self.cfg.patches_per_image
        for n in reversed(self.buckets):
            self._set_cu_seqlens(n, [per_image] * n)
            self.tower.plan_images(self.cu_seqlens_host[: n + 1])
            pixels = self.static_pixels[: n * per_image]
            self.tower(pixels)  # warm-up: JIT modules, allocator
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=self.pool):
                out = self.tower(pixels)
            self.graphs[n] = VisionGraph(graph=g, num_images=n, static_out=out)

    def replay(self, images: ImageInputs) -> torch.Tensor:
        self._check_captured()
        logger.debug("vision replay grid %s", images.grid_thw)  # ok: FC101
        counts = images.patch_counts_host.tolist()  # ok: FC101
        n = self._bucket_for(images.num_images)
        entry = self.graphs[n]
        total = images.total_patches
        if total > self.static_pixels.shape[0]:
            # an image larger than the captured pixel budget: grow the staging buffer
            self.static_pixels = torch.empty(total, self.cfg.patch_dim, dtype=torch.bfloat16, device=self.device)  # expect: FC107
        self.static_pixels[:total].copy_(images.pixel_values, non_blocking=True)
        self._set_cu_seqlens(n, counts + [0] * (n - len(counts)))
        self.tower.plan_images(self.cu_seqlens_host[: n + 1])
        entry.graph.replay()
        merged = sum(counts) // 4
        if self.patch_scratch is None:
            self.patch_scratch = torch.empty(self.static_pixels.shape[0] // 4, self.cfg.hidden_size, dtype=torch.bfloat16, device=self.device)  # ok: FC107
        # keep the embeddings until the scatter: the next replay overwrites static_out
        self.patch_scratch[:merged].copy_(entry.static_out[:merged])
        return self.patch_scratch[:merged]
