"""Per-layer, per-kv-head FP8 scales and the amax tracker that recalibrates them online."""

import logging
from dataclasses import dataclass

import numpy as np
import torch

from fp8kv.config import FP8_E4M3_MAX, Fp8ServeConfig

logger = logging.getLogger(__name__)


@dataclass
class HeadScales:
    """Dequantisation scales [layers, kv_heads] on the device, with host mirrors.

    The device buffers are read by address from captured graphs (the quantise-on-write
    kernel and the q/out folding), so they are only ever updated in place.
    """

    k_scale: torch.Tensor
    v_scale: torch.Tensor
    k_scale_np: np.ndarray
    v_scale_np: np.ndarray

    @classmethod
    def ones(cls, num_layers: int, num_kv_heads: int, device) -> "HeadScales":
        return cls(
            k_scale=torch.ones(num_layers, num_kv_heads, dtype=torch.float32, device=device),
            v_scale=torch.ones(num_layers, num_kv_heads, dtype=torch.float32, device=device),
            k_scale_np=np.ones((num_layers, num_kv_heads), dtype=np.float32),
            v_scale_np=np.ones((num_layers, num_kv_heads), dtype=np.float32),
        )


class ScaleTracker:
    """Keeps a window of per-head amax values; the captured write kernel maxes into row 0."""

    def __init__(self, cfg: Fp8ServeConfig, scales: HeadScales, device):
        self.cfg = cfg
        self.scales = scales
        self.amax_history = torch.zeros(
            cfg.amax_history_len, cfg.num_layers, 2, cfg.num_kv_heads, dtype=torch.float32, device=device
        )
        self.scales_host = torch.ones(2, cfg.num_layers, cfg.num_kv_heads, dtype=torch.float32, pin_memory=True)
        self.scales_ready = torch.cuda.Event()
        self.recal_steps_cpu = torch.zeros(0, dtype=torch.int64)

    def current_amax(self, layer: int) -> torch.Tensor:
        """Row 0 of the window for one layer: [2, kv_heads], written by the quantise kernel."""
        return self.amax_history[0, layer]

    def observe(self, step: int) -> None:
        amax = self.amax_history.amax(dim=0)
        target = amax / FP8_E4M3_MAX * self.cfg.rescale_margin
        k_new = torch.where(target[:, 0] > 0, target[:, 0], self.scales.k_scale)  # ok: FC101
        v_new = torch.where(target[:, 1] > 0, target[:, 1], self.scales.v_scale)
        if (k_new > self.scales.k_scale * self.cfg.rescale_margin).any():  # expect: FC101
            self.scales.k_scale.copy_(k_new)  # ok: FC104
            self.scales.v_scale.copy_(v_new)
            self.recal_steps_cpu = torch.cat([self.recal_steps_cpu, torch.tensor([step])])  # ok: FC107
            logger.debug("fp8 kv rescaled at step %d: %s", step, k_new)  # ok: FC101
        # slide the window: a fresh row 0 for the next step's writes
        self.amax_history = torch.cat([torch.zeros_like(self.amax_history[:1]), self.amax_history[:-1]])  # expect: FC107
        self.scales_host[0].copy_(self.scales.k_scale, non_blocking=True)
        self.scales_host[1].copy_(self.scales.v_scale, non_blocking=True)
        self.scales_ready.record()

    def publish_host_scales(self) -> bool:
        """Refresh the numpy mirrors once the last observe's copy has landed (polls, never waits)."""
        if not self.scales_ready.query():
            return False
        np.copyto(self.scales.k_scale_np, self.scales_host[0].numpy())
        np.copyto(self.scales.v_scale_np, self.scales_host[1].numpy())
        return True

    def export_calibration(self, path: str) -> None:
        k = self.scales.k_scale.cpu().numpy()  # ok: FC101
        v = self.scales.v_scale.cpu().numpy()
        np.savez(path, k_scale=k, v_scale=v, recal_steps=self.recal_steps_cpu.numpy())
