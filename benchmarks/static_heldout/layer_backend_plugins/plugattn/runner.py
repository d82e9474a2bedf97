"""Model runner and decode graph runner over the plugin host."""
from __future__ import annotations

from typing import Dict, List, Sequence

import numpy as np
import torch
from torch import nn

from plugattn._kernels import fused_qkv_rope  # the engine's compiled extension
from plugattn.forward_batch import ForwardBatch, Mode, PluginConfig
from plugattn.host import PluginHost


class PluggedAttention(nn.Module):
    def __init__(self, layer_id: int, hidden: int, cfg: PluginConfig, host: PluginHost):
        super().__init__()
        self.layer_id = layer_id
        self.cfg = cfg
        self.host = host
        self.qkv = nn.Linear(hidden, (cfg.num_qo_heads + 2 * cfg.num_kv_heads) * cfg.head_dim, bias=False)
        self.o = nn.Linear(cfg.num_qo_heads * cfg.head_dim, hidden, bias=False)

    def forward(self, h: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        q = fused_qkv_rope(self.qkv(h), positions, kv_cache, fb.kv_indices, self.cfg.num_qo_heads, self.cfg.head_dim)
        out = self.host.forward(self.layer_id, q, kv_cache, fb)
        return self.o(out.reshape(h.shape[0], -1))


class PluggedModel(nn.Module):
    def __init__(self, vocab: int, hidden: int, cfg: PluginConfig, host: PluginHost, num_layers: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList([PluggedAttention(i, hidden, cfg, host) for i in range(num_layers)])
        self.lm_head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, kv_caches: List[torch.Tensor], fb: ForwardBatch) -> torch.Tensor:
        h = self.embed(ids)
        for layer, kv in zip(self.layers, kv_caches):
            h = h + layer(h, positions, kv, fb)
        return self.lm_head(h)


class CudaGraphRunner:
    def __init__(self, model: PluggedModel, host: PluginHost, cfg: PluginConfig, kv_caches: List[torch.Tensor]):
        self.model = model
        self.host = host
        self.cfg = cfg
        self.kv_caches = kv_caches
        dev = host.device
        self.ids = torch.zeros(cfg.max_bs, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(cfg.max_bs, dtype=torch.int64, device=dev)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.out: Dict[int, torch.Tensor] = {}

    def _dummy_batch(self, bs: int) -> ForwardBatch:
        dev = self.host.device
        ones = torch.ones(bs, dtype=torch.int32)
        return ForwardBatch(
            mode=Mode.DECODE, bs=bs,
            seq_lens=ones.to(dev), seq_lens_cpu=ones,
            req_pool_indices=torch.arange(bs, device=dev),
            kv_indptr_cpu=torch.arange(bs + 1, dtype=torch.int32).pin_memory(),
            kv_indices=torch.zeros(bs, dtype=torch.int32, device=dev),
            kv_last_page_len_cpu=ones.pin_memory(),
        )

    def capture_one_batch_size(self, bs: int) -> None:
        fb = self._dummy_batch(bs)
        self.host.init_forward_metadata_capture_cuda_graph(bs, fb)
        torch.cuda.synchronize()  # ok: FC101
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            self.out[bs] = self.model(self.ids[:bs], self.positions[:bs], self.kv_caches, fb)
        self.graphs[bs] = g

    def capture(self) -> None:
        self.host.init_cuda_graph_state()
        for bs in reversed(self.cfg.graph_batch_sizes):
            self.capture_one_batch_size(bs)

    def replay(self, ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        bs = next(b for b in self.cfg.graph_batch_sizes if b >= fb.bs)
        self.host.init_forward_metadata_replay_cuda_graph(bs, fb)
        self.ids[: fb.bs].copy_(ids)
        self.positions[: fb.bs].copy_(positions)
        self.graphs[bs].replay()
        return self.out[bs][: fb.bs]
