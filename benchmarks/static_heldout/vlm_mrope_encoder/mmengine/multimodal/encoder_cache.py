"""Vision-encoder outputs cached per image, and their merge into the text embeddings of a chunk."""
from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Callable, Optional

import numpy as np
import torch

from .inputs import ImageItem

if TYPE_CHECKING:
    from ..model_executor.forward_batch import ForwardBatch


class EncoderCacheManager:
    def __init__(self, capacity_bytes: int, hidden_size: int, merge_unit: int = 4, encoder: Optional[Callable] = None) -> None:
        assert capacity_bytes > 0, "the encoder cache needs a positive byte budget"  # expect: FC109
        self.capacity_bytes, self.hidden_size, self.merge_unit = capacity_bytes, hidden_size, merge_unit
        self.encoder = encoder
        self._entries: OrderedDict[int, torch.Tensor] = OrderedDict()
        self._used = 0

    def get_or_encode(self, item: ImageItem) -> torch.Tensor:
        if (hit := self._entries.get(item.hash)) is not None:
            self._entries.move_to_end(item.hash)
            return hit
        num_tokens = int(item.grid_thw.prod()) // self.merge_unit  # expect: FC101
        self._evict_until(num_tokens * self.hidden_size * 2)
        embeds = self.encoder(item.pixel_values, item.grid_thw_np)
        # keep a copy: the tower's output buffer is reused by the next image
        self._entries[item.hash] = embeds.clone()  # ok: FC107
        self._used += embeds.numel() * embeds.element_size()  # ok: FC101
        return self._entries[item.hash]

    def _evict_until(self, need: int) -> None:
        while self._entries and self._used + need > self.capacity_bytes:
            _, old = self._entries.popitem(last=False)
            self._used -= old.numel() * old.element_size()
        assert self._used >= 0, "encoder cache accounting went negative"  # ok: FC109


class MultimodalEmbeddingBuilder:
    """Scatters cached image embeddings over the placeholder tokens of this step's chunk."""

    def __init__(self, cache: EncoderCacheManager) -> None:
        self.cache = cache

    def build(self, fb: "ForwardBatch", input_embeds: torch.Tensor) -> torch.Tensor:
        if not any(mm is not None for mm in fb.mm_inputs):  # ok: FC101
            return input_embeds
        rows, chunks, off = [], [], 0
        for mm, prefix, ext in zip(fb.mm_inputs, fb.extend_prefix_lens_cpu, fb.extend_seq_lens_cpu):
            for item in mm.items if mm is not None else ():
                lo, hi = max(prefix, item.offset), min(prefix + ext, item.offset + item.num_tokens)
                if lo < hi:
                    rows.append(np.arange(lo, hi) - prefix + off)
                    chunks.append(self.cache.get_or_encode(item)[lo - item.offset : hi - item.offset])
            off += ext
        if rows:
            idx = torch.from_numpy(np.concatenate(rows)).pin_memory().to(input_embeds.device, non_blocking=True)
            input_embeds.index_copy_(0, idx, torch.cat(chunks).to(input_embeds.dtype))
        return input_embeds
