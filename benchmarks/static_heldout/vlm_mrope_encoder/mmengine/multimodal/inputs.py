"""Image items of a request and their 3-D (M-RoPE) positions, computed once when the request arrives."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Union, overload

import numpy as np
import torch


@dataclass
class ImageItem:
    hash: int
    offset: int  # first placeholder token in the prompt
    num_tokens: int  # placeholder tokens after the spatial merge
    pixel_values: torch.Tensor
    grid_thw: torch.Tensor  # (t, h, w) in patches, as the processor returns it
    grid_thw_np: np.ndarray


@dataclass
class MultimodalInputs:
    items: list[ImageItem] = field(default_factory=list)
    mrope_positions: Optional[np.ndarray] = None
    mrope_delta: int = 0

    def to_device(self, device: torch.device) -> None:
        for item in self.items:
            item.pixel_values = item.pixel_values.to(device, non_blocking=True)
            item.grid_thw = item.grid_thw.to(device, non_blocking=True)


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8), [0]])))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist()))


@overload
def get_rope_index(input_ids: list[int], image_grid_thw: Optional[np.ndarray], image_token_id: int, merge: int = 2) -> tuple[np.ndarray, int]: ...
@overload
def get_rope_index(input_ids: np.ndarray, image_grid_thw: Optional[np.ndarray], image_token_id: int, merge: int = 2) -> tuple[np.ndarray, int]: ...
def get_rope_index(input_ids: Union[list[int], np.ndarray], image_grid_thw, image_token_id, merge=2):
    """Text tokens advance all three axes together; an image's tokens take (t, h, w) grid coordinates."""
    assert image_grid_thw is None or image_grid_thw.shape[1] == 3, "image_grid_thw must be (num_images, 3)"  # expect: FC109
    ids = np.asarray(input_ids)
    parts, cur, prev_end = [], 0, 0
    grids = image_grid_thw.tolist() if image_grid_thw is not None else []
    for (start, end), (t, h, w) in zip(_runs(ids == image_token_id), grids):
        text = np.arange(start - prev_end) + cur
        parts.append(np.broadcast_to(text, (3, text.size)))
        cur += start - prev_end
        tt, hh, ww = np.meshgrid(np.arange(t), np.arange(h // merge), np.arange(w // merge), indexing="ij")
        parts.append(np.stack([tt.ravel(), hh.ravel(), ww.ravel()]) + cur)
        cur += max(t, h // merge, w // merge)
        prev_end = end
    tail = np.arange(ids.size - prev_end) + cur
    parts.append(np.broadcast_to(tail, (3, tail.size)))
    positions = np.concatenate(parts, axis=1)
    return positions, int(positions.max()) + 1 - ids.size
