from __future__ import annotations

from typing import Callable, Dict, Tuple

import torch

from auto_deploy.custom_ops.attention_interface import SequenceInfo


class CachedSequenceInterface:
    """What the exported graph receives: the sequence info's tensors, the caches and the global buffers."""

    def __init__(self, sequence_info: SequenceInfo, device: str = "cuda"):
        self.info = sequence_info
        self.device = device
        self._cache_initializers: Dict[str, Callable[[SequenceInfo], torch.Tensor]] = {}
        self._buffer_initializers: Dict[str, Callable[[SequenceInfo], torch.Tensor]] = {}
        self._caches: Dict[str, torch.Tensor] = {}

    def add_cache(self, name: str, init: Callable[[SequenceInfo], torch.Tensor]) -> None:
        self._cache_initializers[name] = init

    def add_buffer(self, name: str, init: Callable[[SequenceInfo], torch.Tensor]) -> None:
        self._buffer_initializers[name] = init

    def initialize_caches(self) -> int:
        for name, init in {**self._cache_initializers, **self._buffer_initializers}.items():
            self._caches[name] = init(self.info)
        return len(self._caches)

    @property
    def args(self) -> Tuple[torch.Tensor, ...]:
        return (*self.info.args, *self._caches.values(), *self.info.host_plan_args)
