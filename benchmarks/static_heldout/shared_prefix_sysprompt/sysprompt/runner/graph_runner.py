"""Decode graphs per batch size; the prefix and suffix plans are refreshed before each replay."""
from __future__ import annotations

from typing import Dict, Optional

import torch

from sysprompt.attn.cascade_backend import ForwardBatch, PrefixGroup, SharedPrefixBackend
from sysprompt.config import ServerConfig
from sysprompt.model import SysPromptLM


class SysPromptGraphRunner:
    def __init__(self, cfg: ServerConfig, model: SysPromptLM, backend: SharedPrefixBackend) -> None:
        self.cfg = cfg
        self.model = model
        self.backend = backend
        dev = torch.device(cfg.device)
        self.device = dev
        max_bs = max(cfg.cuda_graph_bs)
        self.input_ids = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.pool: Optional[tuple] = None

    def _dummy_batch(self, bs: int) -> ForwardBatch:
        """Every row its own one-page prompt and one suffix page."""
        ar = torch.arange(bs + 1, dtype=torch.int32)
        ones = torch.ones(bs, dtype=torch.int32)
        slots = torch.arange(bs, dtype=torch.int64)
        return ForwardBatch(
            batch_size=bs,
            input_ids=self.input_ids[:bs],
            positions=self.positions[:bs],
            prefix_slot=slots.to(self.device),
            prefix_slot_cpu=slots,
            prefix_lens=ones.to(self.device),
            seq_lens_cpu=ones * 2,
            suffix_kv_indptr_cpu=ar,
            suffix_kv_indices=ar[:bs].to(self.device),
            suffix_last_page_len_cpu=ones,
            suffix_last_page_len=ones.to(self.device),
            groups=[PrefixGroup(slot=i, first_row=i, num_rows=1) for i in range(bs)],
        )

    def capture(self) -> None:
        for bs in sorted(self.cfg.cuda_graph_bs, reverse=True):
            self.capture_one_batch_size(bs)

    def capture_one_batch_size(self, bs: int) -> None:
        batch = self._dummy_batch(bs)
        self.backend.init_forward_metadata_capture_cuda_graph(bs, batch)
        for _ in range(2):
            self.model(self.input_ids[:bs], self.positions[:bs], bs)
        # a NaN log-sum-exp means a row attended to no suffix page at all
        if bool(torch.isnan(self.backend.merge_lse[:bs]).any()):  # expect: FC101
            raise RuntimeError(f"NaN suffix LSE while warming up bs={bs}")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = self.model(self.input_ids[:bs], self.positions[:bs], bs)
        self.pool = graph.pool()
        self.graphs[bs] = graph
        self.outputs[bs] = out

    def bucket(self, raw_bs: int) -> Optional[int]:
        for bs in sorted(self.cfg.cuda_graph_bs):
            if bs >= raw_bs:
                return bs
        return None

    def replay(self, batch: ForwardBatch, bs: int) -> torch.Tensor:
        raw_bs = batch.batch_size
        self.input_ids[:raw_bs].copy_(batch.input_ids)
        self.positions[:raw_bs].copy_(batch.positions)
        self.backend.init_forward_metadata_replay_cuda_graph(bs, batch)
        self.graphs[bs].replay()
        return self.outputs[bs][:raw_bs]
