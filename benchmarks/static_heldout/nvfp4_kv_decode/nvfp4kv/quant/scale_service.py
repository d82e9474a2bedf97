"""Moves the global KV scales when the observed range drifts.

Every ``interval`` steps the running amax is compared with the scales the pages
were written under; when they drift apart, the scales move, the live pages are
re-encoded into shadow pages and the decode tables are switched to them.
"""
from __future__ import annotations

from typing import Optional

import torch

from nvfp4kv.attn.backend import QuantDecodeBackend
from nvfp4kv.attn.kernels import WrapperFp8Decode
from nvfp4kv.quant.kv_pool import QuantKVPool


class ScaleUpdateService:
    def __init__(
        self,
        pool: QuantKVPool,
        backend: QuantDecodeBackend,
        interval: int = 256,
        headroom: float = 1.25,
        tolerance: float = 0.1,
    ):
        self.pool = pool
        self.backend = backend
        self.interval = interval
        self.headroom = headroom
        self.tolerance = tolerance
        self._backend = "xqa" if pool.fmt == "nvfp4" else "fp8"  # ok: FC103
        self.steps = 0
        L = pool.limits.num_layers
        self.amax_host = torch.zeros(2, L, dtype=torch.float32, pin_memory=True)
        self._amax_event: Optional[torch.cuda.Event] = None
        self.last_amax_seen = 0.0
        self.requant_log_cpu = torch.zeros(0, dtype=torch.int64)
        self._remap = torch.arange(pool.limits.num_pages, dtype=torch.int32, device=pool.device)

    def set_layer_scale(self, layer: int, k_scale: float, v_scale: float) -> None:
        """Calibrated scales shipped with the checkpoint."""
        assert k_scale > 0 and v_scale > 0, "KV scales must be positive"  # expect: FC109
        self.pool.kv_global_scale[0, layer] = k_scale
        self.pool.kv_global_scale[1, layer] = v_scale
        impl = self.backend.impl
        if isinstance(impl, WrapperFp8Decode):
            impl.fold_k_scale(k_scale)

    def on_step(self) -> None:
        self.steps += 1
        # last interval's snapshot, polled without blocking; exported as a metric
        if self._amax_event is not None and self._amax_event.query():
            self.last_amax_seen = float(self.amax_host.max())  # ok: FC101
            self._amax_event = None
        if self.steps % self.interval:
            return
        self.amax_host.copy_(self.pool.amax, non_blocking=True)
        self._amax_event = torch.cuda.Event()
        self._amax_event.record()

        target = self.pool.amax * self.headroom / self.pool.fmt_max
        if torch.allclose(target, self.pool.kv_global_scale, rtol=self.tolerance):  # expect: FC101
            return
        prev = self.pool.kv_global_scale
        self.pool.kv_global_scale = torch.cat([target[:1], torch.maximum(target[1:], prev[1:])])  # expect: FC107
        self.requant_log_cpu = torch.cat([self.requant_log_cpu, torch.tensor([self.steps])])  # ok: FC107
        old, new = self.pool.requantize(prev)
        self._remap_pages(old, new)

    def _remap_pages(self, old: torch.Tensor, new: torch.Tensor) -> None:
        """Point the decode tables at the shadow pages."""
        b = self.backend
        remap = self._remap
        remap[old] = new.to(torch.int32)
        b.block_tables.copy_(remap[b.block_tables.long()])  # ok: FC104
        indices = b.kv_indices
        indices.copy_(remap[indices.long()])  # expect: FC104
        remap[old] = old.to(torch.int32)
