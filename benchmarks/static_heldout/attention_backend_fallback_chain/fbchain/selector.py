"""The chain: ordered at start-up by capability, consulted every step by batch shape."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Dict, List, Sequence, Type

import torch

from fbchain.capability import DeviceCaps
from fbchain.config import ChainConfig

if TYPE_CHECKING:
    from fb_backends.base import AttentionBackendBase, StepInputs

logger = logging.getLogger(__name__)


class BackendChain:
    def __init__(
        self,
        cfg: ChainConfig,
        caps: DeviceCaps,
        device: torch.device,
        classes: Sequence[Type["AttentionBackendBase"]],
    ):
        self.cfg = cfg
        self.caps = caps
        self.device = device
        self._classes: Dict[str, Type["AttentionBackendBase"]] = {c.name: c for c in classes}
        self._instances: Dict[str, "AttentionBackendBase"] = {}
        self.order: List[str] = [
            n for n in cfg.chain if n in self._classes and self._classes[n].supports(caps, cfg.dtype, cfg.head_dim)
        ]
        if not self.order:
            raise RuntimeError(f"no attention backend supports sm{caps.sm} / {cfg.dtype} / head_dim {cfg.head_dim}")
        self._backend = self.order[0]
        self.fallback_hits = torch.zeros(len(self.order), dtype=torch.int64, device=device)

    @property
    def active_name(self) -> str:
        return self._backend  # ok: FC103

    def put(self, backend: "AttentionBackendBase") -> None:
        self._instances[backend.name] = backend

    def get(self, name: str) -> "AttentionBackendBase":
        inst = self._instances.get(name)
        if inst is None:
            inst = self._classes[name](self.cfg, self.caps, self.device)
            self._instances[name] = inst
        return inst

    def _fits_trtllm(self, inputs: "StepInputs") -> bool:
        if inputs.seq_lens.max() > self.caps.trtllm_max_kv_len:  # expect: FC101
            return False
        return inputs.is_decode or self.cfg.trtllm_prefill

    def _fits_fa2(self, inputs: "StepInputs") -> bool:
        longest = int(inputs.seq_lens_cpu.max())  # ok: FC101
        return longest <= self.cfg.max_model_len

    def select_for_step(self, inputs: "StepInputs") -> "AttentionBackendBase":
        for i, name in enumerate(self.order):
            if name == "trtllm-gen" and not self._fits_trtllm(inputs):
                continue
            if name == "fa2" and not self._fits_fa2(inputs):
                continue
            if name != self._backend:
                self.fallback_hits[i].add_(1)
                logger.debug("step falls back from %s to %s (longest %s)", self._backend, name, inputs.seq_lens.max())  # ok: FC101
            return self.get(name)
        return self.get(self.order[-1])

    def health_report(self) -> dict:
        """Admin endpoint: how often each backend had to take over."""
        return {"active": self.active_name, "fallback_hits": self.fallback_hits.cpu().tolist()}  # ok: FC101
