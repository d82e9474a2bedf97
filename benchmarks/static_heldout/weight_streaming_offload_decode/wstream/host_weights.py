"""Layer weights kept in host memory as one flat tensor per layer."""

from dataclasses import dataclass
from typing import Dict, List

import torch

from wstream.config import StreamConfig


@dataclass
class LayerWeights:
    qkv: torch.Tensor
    o: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor


def split_layer(flat: torch.Tensor, cfg: StreamConfig) -> LayerWeights:
    h, i = cfg.hidden, cfg.intermediate
    sizes = [cfg.qkv_out * h, h * h, 2 * i * h, i * h]
    qkv, o, gate_up, down = flat[: sum(sizes)].split(sizes)
    return LayerWeights(
        qkv=qkv.view(cfg.qkv_out, h), o=o.view(h, h), gate_up=gate_up.view(2 * i, h), down=down.view(h, i)
    )


class HostWeightStore:
    """Flat per-layer tensors; mmap'd checkpoints are pinned on first use."""

    def __init__(self, layers_cpu: List[torch.Tensor]):
        self.layers_cpu = layers_cpu
        self.dtype = layers_cpu[0].dtype
        self.pinned_cache: Dict[int, torch.Tensor] = {}

    def layer(self, i: int) -> torch.Tensor:
        src_cpu = self.layers_cpu[i]
        if src_cpu.is_pinned():
            return src_cpu
        if i not in self.pinned_cache:
            self.pinned_cache[i] = torch.empty(src_cpu.numel(), dtype=src_cpu.dtype, pin_memory=True)  # ok: FC107
            self.pinned_cache[i].copy_(src_cpu.view(-1))
        return self.pinned_cache[i]
