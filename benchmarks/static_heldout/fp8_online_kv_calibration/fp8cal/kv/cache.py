"""FP8 (e4m3) paged KV cache with per-layer K/V scales, and bf16 pages for outlier layers."""
from __future__ import annotations

from typing import Dict, Tuple

import torch

from fp8cal.kv.quant_kernels import Fp8QuantKernels
from fp8cal.settings import CalibSettings

FP8 = torch.float8_e4m3fn


class Fp8PagedKVCache:
    def __init__(self, s: CalibSettings, device: torch.device):
        self.s = s
        self.device = device
        shape = (s.max_pages, s.page_size, s.num_kv_heads, s.head_dim)
        self.bf16_layers = frozenset(s.bf16_layers)
        self.k = [torch.zeros(shape, dtype=FP8, device=device) for _ in range(s.num_layers)]
        self.v = [torch.zeros(shape, dtype=FP8, device=device) for _ in range(s.num_layers)]
        self.bf16_pages: Dict[int, Tuple[torch.Tensor, torch.Tensor]] = {
            layer: (torch.zeros(shape, dtype=s.dtype, device=device), torch.zeros(shape, dtype=s.dtype, device=device))
            for layer in s.bf16_layers
        }
        # read by the attention kernels (and by the recorded graphs) by address
        self.k_scale = torch.ones(s.num_layers, dtype=torch.float32, device=device)
        self.v_scale = torch.ones(s.num_layers, dtype=torch.float32, device=device)
        self.out_loc = torch.zeros(s.max_batch_size, dtype=torch.long, device=device)
        self.kernels = Fp8QuantKernels(device)

    def fp8_kv(self, layer: int) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.k[layer], self.v[layer]

    def bf16_kv(self, layer: int) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.bf16_pages[layer]

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor, loc: torch.Tensor) -> None:
        kv, d = self.s.num_kv_heads, self.s.head_dim
        if layer in self.bf16_layers:
            kb, vb = self.bf16_pages[layer]
            kb.view(-1, kv, d).index_copy_(0, loc, k)
            vb.view(-1, kv, d).index_copy_(0, loc, v)
            return
        self.kernels.quantize_into(self.k[layer].view(-1, kv, d), loc, k, self.k_scale[layer])
        self.kernels.quantize_into(self.v[layer].view(-1, kv, d), loc, v, self.v_scale[layer])

    def set_scales(self, k_scale: torch.Tensor, v_scale: torch.Tensor) -> None:
        assert k_scale.shape == v_scale.shape == self.k_scale.shape  # expect: FC109
        self.k_scale.copy_(k_scale)  # ok: FC104
        self.v_scale.copy_(v_scale)

    def requantize_pages(
        self,
        page_ids: torch.Tensor,
        old_k: torch.Tensor,
        new_k: torch.Tensor,
        old_v: torch.Tensor,
        new_v: torch.Tensor,
        scratch: torch.Tensor,
    ) -> None:
        chunk = scratch.shape[0]
        for layer in range(self.s.num_layers):
            if layer in self.bf16_layers:
                continue
            for pages, old, new in ((self.k[layer], old_k, new_k), (self.v[layer], old_v, new_v)):
                ratio = old[layer] / new[layer]
                for start in range(0, page_ids.shape[0], chunk):
                    ids = page_ids[start : start + chunk]
                    buf = scratch[: ids.shape[0]]
                    buf.copy_(pages.index_select(0, ids))
                    buf.mul_(ratio).clamp_(-448.0, 448.0)
                    pages.index_copy_(0, ids, buf.to(FP8))
