"""The plugin host: instantiates one plugin per distinct name and dispatches every layer to its own."""
from __future__ import annotations

import logging
from typing import Callable, Dict, List, Sequence

import torch

from plugattn.backends import fi_paged, fi_trtllm, fi_window  # noqa: F401  (registers the plugins)
from plugattn.forward_batch import ForwardBatch, Mode, PluginConfig
from plugattn.prefix import SharedPrefixMerger
from plugattn.registry import AttnPlugin, create_plugin

logger = logging.getLogger(__name__)


def plugin_names_for(layer_types: Sequence[str], sm: int) -> List[str]:
    """HF-style ``layer_types`` to plugin names; Blackwell runs full layers on trtllm-gen."""
    full = "fi_trtllm" if sm >= 100 else "fi_paged"
    return [full if t == "full_attention" else "fi_window" for t in layer_types]


class PluginHost:
    def __init__(self, cfg: PluginConfig, layer_types: Sequence[str], device: torch.device, prefix_workspace_bytes: int):
        self.cfg = cfg
        self.device = device
        sm = torch.cuda.get_device_capability(device)[0] * 10
        self.layer_names = plugin_names_for(layer_types, sm)
        self.plugins: Dict[str, AttnPlugin] = {}
        for name in self.layer_names:
            if name not in self.plugins:
                self.plugins[name] = create_plugin(name, cfg, device)
        self.layer_plugins: List[AttnPlugin] = [self.plugins[n] for n in self.layer_names]
        self.prefix_workspace = torch.zeros(prefix_workspace_bytes, dtype=torch.uint8, device=device)
        self.prefix = SharedPrefixMerger(cfg, self.prefix_workspace)
        self.prefix_kv: List[torch.Tensor] = []
        self._handlers: Dict[Mode, Callable] = {
            Mode.DECODE: self._forward_decode,
            Mode.EXTEND: self._forward_extend,
        }

    def _layers_of(self, name: str) -> List[int]:
        layers = [i for i, n in enumerate(self.layer_names) if n == name]
        assert layers, "plugin instantiated without layers"  # ok: FC109
        return layers

    def summary(self) -> Dict[str, List[int]]:
        return {name: self._layers_of(name) for name in self.plugins}

    # ---- metadata, fanned out to every plugin -----------------------------------------------------
    def init_cuda_graph_state(self) -> None:
        for p in self.plugins.values():
            p.init_cuda_graph_state()

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        if fb.is_decode:  # ok: FC101
            self.prefix.plan(fb)
        for p in self.plugins.values():
            p.init_forward_metadata(fb)

    def init_forward_metadata_capture_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        for p in self.plugins.values():
            p.init_forward_metadata_capture_cuda_graph(bs, fb)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        self.prefix.plan(fb)
        for p in self.plugins.values():
            p.init_forward_metadata_replay_cuda_graph(bs, fb)

    def on_requests_finished(self, row_ranges: List[tuple]) -> None:
        for p in self.plugins.values():
            for start, end in row_ranges:
                p.release_rows(start, end)

    # ---- per-layer dispatch -----------------------------------------------------------------------
    def forward(self, layer_id: int, q: torch.Tensor, kv_cache: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        return self._handlers[fb.mode](layer_id, q, kv_cache, fb)

    def _forward_decode(self, layer_id: int, q: torch.Tensor, kv_cache: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        o = self.layer_plugins[layer_id].forward_decode(q, kv_cache, fb)
        if self.prefix.enabled:
            o = self.prefix.merge(q, self.prefix_kv[layer_id], o, fb.extra["lse"][layer_id])
        return o

    def _forward_extend(self, layer_id: int, q: torch.Tensor, kv_cache: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        plugin = self.layer_plugins[layer_id]
        extend = getattr(plugin, "forward_extend", None)
        if extend is None:
            raise NotImplementedError(f"{plugin.plugin_name} has no extend path")
        return extend(q, kv_cache, fb, fb.extra["max_q_len"], fb.extra["cu_q"], fb.extra["cu_kv"])
