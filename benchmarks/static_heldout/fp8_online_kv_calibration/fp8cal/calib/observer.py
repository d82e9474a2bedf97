"""Running amax of the keys and values each layer writes to the cache."""
from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)


class AmaxObserver:
    def __init__(self, num_layers: int, calib_steps: int, device: torch.device):
        assert calib_steps > 0, "calibration needs at least one step"  # expect: FC109
        self.num_layers = num_layers
        self.calib_steps = calib_steps
        # written inside the model (also inside the recorded graphs)
        self.step_k_amax = torch.zeros(num_layers, dtype=torch.float32, device=device)
        self.step_v_amax = torch.zeros(num_layers, dtype=torch.float32, device=device)
        self.running_k = torch.zeros(num_layers, dtype=torch.float32, device=device)
        self.running_v = torch.zeros(num_layers, dtype=torch.float32, device=device)
        self.amax_hist = torch.zeros(0, 2, num_layers, dtype=torch.float32, device=device)
        self.steps_seen = 0

    def record(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        k_max = k.abs().amax().float()
        v_max = v.abs().amax().float()
        self.step_k_amax[layer : layer + 1].copy_(torch.maximum(self.step_k_amax[layer], k_max).view(1))
        self.step_v_amax[layer : layer + 1].copy_(torch.maximum(self.step_v_amax[layer], v_max).view(1))

    def observe(self) -> None:
        amax = torch.stack([self.step_k_amax, self.step_v_amax])
        if torch.isnan(amax).any():  # expect: FC101
            logger.warning("NaN in the step's K/V amax; step left out of calibration")
            self.step_k_amax.zero_()
            self.step_v_amax.zero_()
            return
        torch.maximum(self.running_k, self.step_k_amax, out=self.running_k)
        torch.maximum(self.running_v, self.step_v_amax, out=self.running_v)
        self.amax_hist = torch.cat([self.amax_hist, amax[None]])  # expect: FC107
        self.steps_seen += 1
        self.step_k_amax.zero_()
        self.step_v_amax.zero_()
        logger.debug("running K amax after %d steps: %s", self.steps_seen, self.running_k)  # ok: FC101

    def recent_max(self, window: int, which: int) -> torch.Tensor:
        return self.amax_hist[-window:, which].amax(dim=0)
