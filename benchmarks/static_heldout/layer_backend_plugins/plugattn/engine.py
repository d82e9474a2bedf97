"""Wires the host, the model and the graph runner into a decode loop."""
from __future__ import annotations

from typing import Dict, List, Sequence

import numpy as np
import torch

from plugattn.forward_batch import ForwardBatch, Mode, PluginConfig
from plugattn.host import PluginHost
from plugattn.runner import CudaGraphRunner, PluggedModel


class ServingEngine:
    def __init__(self, cfg: PluginConfig, layer_types: Sequence[str], vocab: int, hidden: int, device: torch.device):
        self.cfg = cfg
        self.device = device
        # the prefix pass splits at most max_bs rows over the prefix pages
        prefix_ws = cfg.max_bs * cfg.num_qo_heads * (cfg.head_dim + 1) * 4 * 16
        self.host = PluginHost(cfg, layer_types, device, prefix_ws)
        self.model = PluggedModel(vocab, hidden, cfg, self.host, len(layer_types)).to(device)
        self.kv_caches = [
            torch.zeros(cfg.max_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim, dtype=torch.bfloat16, device=device)
            for _ in layer_types
        ]
        self.host.prefix_kv = self.kv_caches
        self.runner = CudaGraphRunner(self.model, self.host, cfg, self.kv_caches)
        self.row_pages: Dict[int, List[int]] = {}
        self.indptr_pinned = torch.zeros(cfg.max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_pinned = torch.ones(cfg.max_bs, dtype=torch.int32, pin_memory=True)

    def make_batch(self, rows: List[int], seq_lens: np.ndarray) -> ForwardBatch:
        bs = len(rows)
        ps = self.cfg.page_size
        pages = [self.row_pages[r] for r in rows]
        self.indptr_pinned[1 : bs + 1] = torch.from_numpy(np.cumsum([len(p) for p in pages]).astype(np.int32))
        self.last_pinned[:bs] = torch.from_numpy(((seq_lens - 1) % ps + 1).astype(np.int32))
        seq_cpu = torch.from_numpy(seq_lens.astype(np.int32))
        return ForwardBatch(
            mode=Mode.DECODE, bs=bs,
            seq_lens=seq_cpu.to(self.device, non_blocking=True), seq_lens_cpu=seq_cpu,
            req_pool_indices=torch.tensor(rows, device=self.device),
            kv_indptr_cpu=self.indptr_pinned, kv_indices=torch.tensor([p for ps_ in pages for p in ps_], dtype=torch.int32, device=self.device),
            kv_last_page_len_cpu=self.last_pinned,
        )

    def decode(self, ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        if fb.bs <= max(self.cfg.graph_batch_sizes):
            return self.runner.replay(ids, positions, fb)
        self.host.init_forward_metadata(fb)
        return self.model(ids, positions, self.kv_caches, fb)

    def finish(self, rows: List[int]) -> None:
        ranges = []
        for r in rows:
            pages = self.row_pages.pop(r)
            ranges.append((min(pages), max(pages) + 1))
        self.host.on_requests_finished(ranges)
