"""The plugin registry: one attention backend class per name, chosen per layer."""
from __future__ import annotations

from typing import Callable, Dict, List, Type

import torch

from plugattn.forward_batch import ForwardBatch, PluginConfig

_REGISTRY: Dict[str, Type["AttnPlugin"]] = {}


def register_attn_plugin(name: str) -> Callable[[Type["AttnPlugin"]], Type["AttnPlugin"]]:
    def deco(cls: Type["AttnPlugin"]) -> Type["AttnPlugin"]:
        if name in _REGISTRY:
            raise KeyError(f"attention plugin {name!r} registered twice")
        cls.plugin_name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def available_plugins() -> List[str]:
    return sorted(_REGISTRY)


def create_plugin(name: str, cfg: PluginConfig, device: torch.device) -> "AttnPlugin":
    assert name in _REGISTRY, f"unknown attention plugin {name}"  # expect: FC109
    return _REGISTRY[name](cfg, device)


class AttnPlugin:
    """Interface every backend implements; the host calls these for the layers it owns."""

    plugin_name = "base"

    def __init__(self, cfg: PluginConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self._metadata_ready = False

    def init_cuda_graph_state(self) -> None:
        pass

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        raise NotImplementedError

    def init_forward_metadata_capture_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        raise NotImplementedError

    def init_forward_metadata_replay_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        raise NotImplementedError

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        raise NotImplementedError

    def release_rows(self, start: int, end: int) -> None:
        pass

    def _plan_kwargs(self) -> dict:
        c = self.cfg
        return dict(num_qo_heads=c.num_qo_heads, num_kv_heads=c.num_kv_heads, head_dim=c.head_dim, page_size=c.page_size, q_data_type=torch.bfloat16)
