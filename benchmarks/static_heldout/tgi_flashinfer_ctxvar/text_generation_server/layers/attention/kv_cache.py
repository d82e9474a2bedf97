"""Paged KV cache of one layer and the attention entry points that use the current FlashInfer state."""

from typing import Optional, Tuple

import torch

from text_generation_server.layers.attention.common import BLOCK_SIZE, Seqlen
from text_generation_server.layers.attention.flashinfer import (
    decode_state,
    prefill_state,
    prefill_with_paged_kv_state,
)


class KVCache:
    """Key and value pages of one layer, laid out as FlashInfer's NHD."""

    def __init__(
        self,
        *,
        num_blocks: int,
        num_heads: int,
        head_size: int,
        dtype: torch.dtype,
        device: torch.device,
    ):
        self._kv_layout = "NHD"
        shape = (num_blocks, BLOCK_SIZE, num_heads, head_size)
        self.kv_cache: Tuple[torch.Tensor, torch.Tensor] = (
            torch.empty(shape, dtype=dtype, device=device),
            torch.empty(shape, dtype=dtype, device=device),
        )

    @property
    def dtype(self) -> torch.dtype:
        return self.kv_cache[0].dtype

    @property
    def key(self) -> torch.Tensor:
        return self.kv_cache[0]

    @property
    def value(self) -> torch.Tensor:
        return self.kv_cache[1]

    def paged_view(self) -> Tuple[torch.Tensor, torch.Tensor]:
        if self._kv_layout != "NHD":  # ok: FC103
            raise ValueError("the FlashInfer path was planned for NHD pages")
        return self.key, self.value

    def store(self, *, key: torch.Tensor, value: torch.Tensor, slots: torch.Tensor) -> None:
        # one token per page, so a slot is a row of the flattened cache
        flat_k = self.key.view(-1, *self.key.shape[2:])
        flat_v = self.value.view(-1, *self.value.shape[2:])
        flat_k.index_copy_(0, slots, key.to(flat_k.dtype))
        flat_v.index_copy_(0, slots, value.to(flat_v.dtype))


def attention(
    *,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    kv_cache: KVCache,
    seqlen: Seqlen,
    softmax_scale: float,
    softcap: Optional[float] = None,
) -> torch.Tensor:
    """Prefill: ragged over the new tokens when nothing is cached, paged over the cache otherwise."""
    paged = prefill_with_paged_kv_state.get(None)
    if paged is not None:
        return paged.run(query.contiguous(), kv_cache.paged_view())
    ragged = prefill_state.get()
    return ragged.run(query.contiguous(), key.contiguous(), value.contiguous())


def paged_attention(
    query: torch.Tensor,
    kv_cache: KVCache,
    seqlen: Seqlen,
    *,
    softcap: Optional[float] = None,
) -> torch.Tensor:
    state = decode_state.get()
    return state.run(query.contiguous(), kv_cache.paged_view())
