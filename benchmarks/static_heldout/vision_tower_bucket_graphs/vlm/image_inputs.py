"""Per-step inputs of the VLM engine: the images of an admission and the prompt batch."""

from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np
import torch

from vlm.config import VLMConfig


@dataclass
class ImageRequest:
    pixel_values: torch.Tensor  # [patches, patch_dim] from the processor (host)
    grid_thw: Sequence[int]  # (t, h, w) in patches


@dataclass
class ImageInputs:
    pixel_values: torch.Tensor  # [total_patches, patch_dim] on the device
    grid_thw: torch.Tensor  # [num_images, 3] on the device: the vision rotary reads it
    patch_counts_host: torch.Tensor  # [num_images] pinned
    num_images: int

    @property
    def total_patches(self) -> int:
        return int(self.grid_thw.prod(-1).sum())  # expect: FC101


@dataclass
class PromptBatch:
    input_ids: torch.Tensor  # [num_tokens] on the device
    positions: torch.Tensor  # [num_tokens] on the device
    qo_indptr_host: torch.Tensor  # pinned
    kv_indptr_host: torch.Tensor  # pinned
    kv_indices: torch.Tensor  # on the device
    last_page_len_host: torch.Tensor  # pinned
    num_image_tokens_cpu: torch.Tensor
    images: Optional[ImageInputs] = None


class PromptBatchFactory:
    """Turns scheduled prompts (numpy token ids and page tables) into a PromptBatch."""

    def __init__(self, cfg: VLMConfig):
        self.cfg = cfg
        self.device = cfg.device
        self.qo_indptr_host = torch.zeros(cfg.max_batch + 1, dtype=torch.int32, pin_memory=True)
        self.kv_indptr_host = torch.zeros(cfg.max_batch + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_host = torch.ones(cfg.max_batch, dtype=torch.int32, pin_memory=True)
        self._qo = self.qo_indptr_host.numpy()
        self._kv = self.kv_indptr_host.numpy()
        self._last = self.last_page_len_host.numpy()

    def images(self, reqs: List[ImageRequest]) -> ImageInputs:
        pixels = torch.cat([r.pixel_values for r in reqs]).to(self.device, non_blocking=True)
        grid = torch.tensor([list(r.grid_thw) for r in reqs], dtype=torch.int32)
        counts = torch.empty(len(reqs), dtype=torch.int32, pin_memory=True)
        counts.copy_(grid.prod(-1))
        return ImageInputs(
            pixel_values=pixels,
            grid_thw=grid.to(self.device),
            patch_counts_host=counts,
            num_images=len(reqs),
        )

    def prompt(
        self,
        token_ids: List[np.ndarray],
        page_tables: List[np.ndarray],
        kv_indices: torch.Tensor,
        images: Optional[ImageInputs] = None,
    ) -> PromptBatch:
        n = len(token_ids)
        lens = np.array([len(t) for t in token_ids], dtype=np.int32)
        pages = np.array([len(p) for p in page_tables], dtype=np.int32)
        self._qo[0] = 0
        self._kv[0] = 0
        np.cumsum(lens, out=self._qo[1 : n + 1])
        np.cumsum(pages, out=self._kv[1 : n + 1])
        self._last[:n] = lens - (pages - 1) * self.cfg.page_size
        ids = np.concatenate(token_ids)
        pos = np.concatenate([np.arange(k, dtype=np.int64) for k in lens])
        num_img = torch.tensor([int((ids == self.cfg.image_token_id).sum())], dtype=torch.int64)
        return PromptBatch(
            input_ids=torch.from_numpy(ids).to(self.device, non_blocking=True),
            positions=torch.from_numpy(pos).to(self.device, non_blocking=True),
            qo_indptr_host=self.qo_indptr_host[: n + 1],
            kv_indptr_host=self.kv_indptr_host[: n + 1],
            kv_indices=kv_indices,
            last_page_len_host=self.last_page_len_host[:n],
            num_image_tokens_cpu=num_img,
            images=images,
        )
