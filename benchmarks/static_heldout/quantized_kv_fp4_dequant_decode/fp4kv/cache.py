"""Paged FP4 KV cache: packed nibbles, FP8 block scales, per-layer global scales, bf16 sink pages."""

import numpy as np
import torch

from .constants import FP4_BLOCK
from .quant import dequant_pages, e2m1_lut


class FP4PageCache:
    def __init__(self, num_layers: int, num_pages: int, page_size: int, num_kv_heads: int, head_dim: int,
                 device, sink_pages: int = 256, overflow_budget: int = 256, dtype=torch.bfloat16):
        assert head_dim % (2 * FP4_BLOCK) == 0, "head_dim must pack into whole scale blocks"  # expect: FC109
        self.num_layers = num_layers
        self.page_size = page_size
        self.device = device
        shape = (num_layers, 2, num_pages, page_size, num_kv_heads)
        self.packed = torch.zeros(shape + (head_dim // 2,), dtype=torch.uint8, device=device)
        self.scales = torch.ones(shape + (head_dim // FP4_BLOCK,), dtype=torch.float8_e4m3fn, device=device)
        # the first page of every request stays in bf16 (attention sinks are outliers)
        self.sink_kv = torch.zeros((num_layers, sink_pages, 2, page_size, num_kv_heads, head_dim), dtype=dtype,
                                   device=device)
        self.global_scale = torch.ones(num_layers, dtype=torch.float32, device=device)
        self.global_scale_host = torch.ones(num_layers, dtype=torch.float32, pin_memory=True)
        # bumped by the quantiser whenever a block scale saturates at FP8's max
        self.overflow_count = torch.zeros(1, dtype=torch.int32, device=device)
        self.overflow_budget = overflow_budget
        self.lut = e2m1_lut(device)
        self.free_np = np.arange(num_pages, dtype=np.int32)[::-1].copy()
        self.free_top = num_pages

    @property
    def needs_recalibration(self) -> bool:
        return int(self.overflow_count[0]) > self.overflow_budget  # expect: FC101

    def pages_for(self, seq_lens: torch.Tensor) -> int:
        """Pages the dequant staging area needs for these sequences."""
        return int(torch.ceil(seq_lens.float() / self.page_size).sum())  # expect: FC101

    def alloc(self, n: int) -> np.ndarray:
        if n > self.free_top:
            raise RuntimeError(f"FP4 KV cache exhausted: need {n} pages, {self.free_top} free")
        self.free_top -= n
        return self.free_np[self.free_top : self.free_top + n].copy()

    def release(self, pages_np: np.ndarray) -> None:
        self.free_np[self.free_top : self.free_top + len(pages_np)] = pages_np
        self.free_top += len(pages_np)

    def upload_scales(self, scales_np: np.ndarray) -> None:
        self.global_scale_host.copy_(torch.from_numpy(scales_np))
        self.global_scale.copy_(self.global_scale_host, non_blocking=True)

    def dequant_into(self, layer: int, page_ids: torch.Tensor, out: torch.Tensor) -> None:
        gs = self.global_scale[layer]
        for kv in (0, 1):
            dequant_pages(self.packed[layer, kv], self.scales[layer, kv], gs, page_ids, self.lut, out[:, kv])

    def _check_layout(self) -> None:
        assert self.packed.shape[-1] * 2 == self.scales.shape[-1] * FP4_BLOCK  # ok: FC109

    def utilisation(self) -> float:
        assert self.free_top <= self.free_np.shape[0]  # ok: FC109
        return 1.0 - self.free_top / self.free_np.shape[0]
