"""Paged KV in NVFP4 (packed e2m1 + e4m3 block scales + a global scale per layer) or FP8.

Layouts: NVFP4 pages are NHD ``[pages, 2, page, kv_heads, head_dim // 2]`` with
block scales ``[pages, 2, page, kv_heads, head_dim // 16]`` (what XQA reads);
FP8 pages are HND ``[pages, 2, kv_heads, page, head_dim]`` (trtllm-gen and the
wrappers), optionally with one scale per page.
"""
from __future__ import annotations

from typing import List, Tuple

import torch
from flashinfer.fp4_quantization import nvfp4_kv_quantize

from nvfp4kv.limits import QuantLimits

FP8_MAX = 448.0
FP4_MAX = 6.0
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def _unpack_nvfp4(q: torch.Tensor, sf: torch.Tensor) -> torch.Tensor:
    """Packed e2m1 pairs and e4m3 block scales -> fp32, on the device."""
    lut = torch.tensor(_E2M1, dtype=torch.float32).to(q.device, non_blocking=True)
    x = torch.stack([lut[(q & 0xF).long()], lut[(q >> 4).long()]], dim=-1).flatten(-2)
    return x * sf.view(torch.float8_e4m3fn).float().repeat_interleave(16, dim=-1)


class QuantKVPool:
    def __init__(self, limits: QuantLimits, device: torch.device, scale_block: int = 16):
        assert limits.head_dim % scale_block == 0, "NVFP4 scales cover 16-element blocks of head_dim"  # expect: FC109
        self.limits = limits
        self.fmt = limits.kv_format
        self.device = device
        self.page_size = limits.page_size
        L, N, P = limits.num_layers, limits.num_pages, limits.page_size
        KVH, D = limits.num_kv_heads, limits.head_dim
        if self.fmt == "nvfp4":
            self.kv_data = [torch.zeros(N, 2, P, KVH, D // 2, dtype=torch.uint8, device=device) for _ in range(L)]
            self.kv_block_sf = [
                torch.zeros(N, 2, P, KVH, D // scale_block, dtype=torch.uint8, device=device) for _ in range(L)
            ]
        else:
            self.kv_data = [torch.zeros(N, 2, KVH, P, D, dtype=torch.float8_e4m3fn, device=device) for _ in range(L)]
            self.page_scale = [torch.ones(N, 2, dtype=torch.float32, device=device) for _ in range(L)]
        # dequantization scale per (K/V, layer); the captured graphs read it
        self.kv_global_scale = torch.ones(2, L, dtype=torch.float32, device=device)
        # running |x| max per (K/V, layer), raised by every write
        self.amax = torch.zeros(2, L, dtype=torch.float32, device=device)
        self.fmt_max = FP8_MAX * FP4_MAX if self.fmt == "nvfp4" else FP8_MAX
        self.free_pages: List[int] = list(range(N - 1, -1, -1))
        self.live_pages: List[int] = []

    def alloc(self, n: int) -> List[int]:
        pages = [self.free_pages.pop() for _ in range(n)]
        self.live_pages.extend(pages)
        return pages

    def write(self, layer: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        P, D = self.page_size, self.limits.head_dim
        page, off = loc // P, loc % P
        for i, x in ((0, k), (1, v)):
            torch.maximum(self.amax[i, layer], x.abs().amax().float(), out=self.amax[i, layer])
        data = self.kv_data[layer]
        if self.fmt == "nvfp4":
            for i, x in ((0, k), (1, v)):
                inv = 1.0 / self.kv_global_scale[i, layer : layer + 1]
                q, sf = nvfp4_kv_quantize(x.reshape(-1, D), inv)
                data[page, i, off] = q.view(x.shape[0], x.shape[1], D // 2)
                self.kv_block_sf[layer][page, i, off] = sf.view(x.shape[0], x.shape[1], -1)
        else:
            data[page, 0, :, off] = (k / self.kv_global_scale[0, layer]).to(torch.float8_e4m3fn)
            data[page, 1, :, off] = (v / self.kv_global_scale[1, layer]).to(torch.float8_e4m3fn)

    def dequantize_pages(self, layer: int, pages: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """FP8 pages with per-page scales -> bf16 NHD pages in ``out`` (for the FA2 fallback)."""
        x = self.kv_data[layer][pages].float() * self.page_scale[layer][pages][:, :, None, None, None]
        n = pages.shape[0]
        out[:n] = (x * self.kv_global_scale[:, layer].view(1, 2, 1, 1, 1)).transpose(2, 3).to(out.dtype)
        return out[:n]

    def requantize(self, prev_scale: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Re-encode every live page under the current global scale into shadow pages.
        The in-flight replay still reads the old pages, so they are not rewritten in place."""
        live = list(self.live_pages)
        shadow = [self.free_pages.pop() for _ in live]
        old = torch.tensor(live, dtype=torch.int64).to(self.device, non_blocking=True)
        new = torch.tensor(shadow, dtype=torch.int64).to(self.device, non_blocking=True)
        D = self.limits.head_dim
        for layer, data in enumerate(self.kv_data):
            for i in range(2):
                ratio = prev_scale[i, layer] / self.kv_global_scale[i, layer]
                if self.fmt == "nvfp4":
                    src = _unpack_nvfp4(data[old, i], self.kv_block_sf[layer][old, i]).reshape(-1, D)
                    inv = 1.0 / self.kv_global_scale[i, layer : layer + 1]
                    q, sf = nvfp4_kv_quantize((src * ratio).to(torch.bfloat16), inv)
                    data[new, i] = q.view_as(data[new, i])
                    self.kv_block_sf[layer][new, i] = sf.view_as(self.kv_block_sf[layer][new, i])
                else:
                    data[new, i] = (data[old, i].float() * ratio).to(torch.float8_e4m3fn)
        self.live_pages = shadow
        self.free_pages.extend(live)
        return old, new
