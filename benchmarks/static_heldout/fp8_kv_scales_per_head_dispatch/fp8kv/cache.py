"""Paged KV cache: FP8 pages for the quantised layers, bf16 pages for the sensitive ones."""

from typing import List, Tuple

import torch

from fp8kv.config import Fp8ServeConfig
from fp8kv.quant import quantize_kv_write


class Fp8PagedKVCache:
    """Separate K and V page tensors per layer, NHD: [pages, page_size, kv_heads, head_dim]."""

    def __init__(self, cfg: Fp8ServeConfig, device):
        self.cfg = cfg
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.page_size = cfg.page_size
        self._kv_layout = "NHD"
        self.k_pages: List[torch.Tensor] = []
        self.v_pages: List[torch.Tensor] = []
        shape = (cfg.num_pages, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        for layer in range(cfg.num_layers):
            dtype = cfg.kv_dtype(layer).torch_dtype
            self.k_pages.append(torch.zeros(shape, dtype=dtype, device=device))
            self.v_pages.append(torch.zeros(shape, dtype=dtype, device=device))

    @property
    def kv_layout(self) -> str:
        return self._kv_layout

    def layer_cache(self, layer: int) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.k_pages[layer], self.v_pages[layer]

    def write(
        self,
        layer: int,
        k: torch.Tensor,
        v: torch.Tensor,
        slot_mapping: torch.Tensor,
        k_scale: torch.Tensor,
        v_scale: torch.Tensor,
        amax: torch.Tensor,
    ) -> None:
        """Store one step's K/V rows; FP8 layers quantise with their per-head scales on the way."""
        assert k.shape[-2] == self.num_kv_heads, "k/v head count does not match the cache"  # expect: FC109
        k_flat = self.k_pages[layer].view(-1, self.num_kv_heads, self.head_dim)
        v_flat = self.v_pages[layer].view(-1, self.num_kv_heads, self.head_dim)
        if k_flat.dtype == torch.bfloat16:
            k_flat.index_copy_(0, slot_mapping, k)
            v_flat.index_copy_(0, slot_mapping, v)
            return
        quantize_kv_write(k.contiguous(), k_scale, amax[0], k_flat, slot_mapping)
        quantize_kv_write(v.contiguous(), v_scale, amax[1], v_flat, slot_mapping)
