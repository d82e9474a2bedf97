"""Decode CUDA graphs, one per batch-size bucket."""

from __future__ import annotations

import bisect
import logging
from typing import TYPE_CHECKING, Dict, List

import numpy as np
import torch

from dcaserve.batch import DCAForwardBatch

if TYPE_CHECKING:
    from dcaserve.model_runner import DCAModelRunner

logger = logging.getLogger(__name__)


class DCAGraphRunner:
    def __init__(self, runner: "DCAModelRunner"):
        self.runner = runner
        self.cfg = runner.cfg
        self.backend = runner.backend
        self.model = runner.model
        self.device = runner.device
        max_bs = self.cfg.max_graph_bs
        self.static_input_ids = torch.zeros(max_bs, dtype=torch.int64, device=self.device)
        self.static_intra_pos = torch.zeros(max_bs, dtype=torch.int64, device=self.device)
        self.static_key_pos = torch.zeros(max_bs, dtype=torch.int64, device=self.device)
        self.static_out_loc = torch.zeros(max_bs, dtype=torch.int64, device=self.device)
        self.static_seq_lens = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        self.static_slots = torch.zeros(max_bs, dtype=torch.int64, device=self.device)
        self.buckets: List[int] = sorted(self.cfg.graph_batch_sizes)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.rope_high_water: Dict[int, int] = {}
        self.pool = None
        self.backend.init_cuda_graph_state()

    def can_run(self, fb: DCAForwardBatch) -> bool:
        return fb.is_decode and fb.batch_size <= self.buckets[-1]

    def _dummy_batch(self, bs: int) -> DCAForwardBatch:
        return DCAForwardBatch(
            rids=[-1] * bs,
            is_decode=True,
            batch_size=bs,
            input_ids=self.static_input_ids[:bs],
            out_cache_loc=self.static_out_loc[:bs],
            intra_pos=self.static_intra_pos[:bs],
            inter_pos=self.backend.inter_positions[:bs],
            key_pos=self.static_key_pos[:bs],
            seq_lens=self.static_seq_lens[:bs],
            seq_lens_np=np.ones(bs, dtype=np.int32),
            prefix_lens_np=np.zeros(bs, dtype=np.int32),
            slots=self.static_slots[:bs],
        )

    def capture_all(self) -> None:
        for bs in reversed(self.buckets):
            self.record_bucket(bs)
        logger.info("captured %d decode graphs", len(self.graphs))

    def record_bucket(self, bs: int) -> None:
        self.backend.init_forward_metadata_capture_cuda_graph(bs)
        for name, w in self.backend.graph_wrappers[bs].items():
            if w._fixed_batch_size != bs:  # expect: FC103
                raise RuntimeError(f"{name} wrapper for bucket {bs} was built for another batch size")
        fb = self._dummy_batch(bs)
        torch.cuda.synchronize()  # ok: FC101
        for _ in range(2):
            self.model.forward_decode(self.static_input_ids[:bs], fb)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = self.model.forward_decode(self.static_input_ids[:bs], fb)
        self.pool = graph.pool()
        self.graphs[bs] = graph
        self.outputs[bs] = out
        self.rope_high_water[bs] = int(self.static_intra_pos[:bs].max())  # expect: FC101

    def replay(self, fb: DCAForwardBatch) -> torch.Tensor:
        raw_bs = fb.batch_size
        bs = self.buckets[bisect.bisect_left(self.buckets, raw_bs)]
        if fb.seq_lens_np.max() >= self.cfg.max_context_len:  # ok: FC101
            raise ValueError(f"sequence past max_context_len={self.cfg.max_context_len}")
        if bool((fb.seq_lens > self.cfg.max_context_len - self.cfg.chunk_size).any()):  # expect: FC101
            logger.warning("a request is within one chunk of the context limit")

        self.static_input_ids[:raw_bs].copy_(fb.input_ids)
        self.static_intra_pos[:raw_bs].copy_(fb.intra_pos)
        self.static_out_loc[:raw_bs].copy_(fb.out_cache_loc)
        self.static_seq_lens[:raw_bs].copy_(fb.seq_lens)
        if bs > self.static_key_pos.shape[0]:
            self.static_key_pos = torch.zeros(bs, dtype=torch.int64, device=self.device)  # expect: FC107
        self.static_key_pos[:raw_bs].copy_(fb.key_pos)
        if raw_bs < bs:
            # padded rows write their garbage K/V into page 0, slot 0
            self.static_out_loc[raw_bs:bs].zero_()
            self.static_intra_pos[raw_bs:bs].zero_()

        rids = list(fb.rids) + [-1] * (bs - raw_bs)
        seq_lens_np = np.concatenate([fb.seq_lens_np, np.ones(bs - raw_bs, dtype=fb.seq_lens_np.dtype)])
        self.backend.refresh_chunk_tables(bs, rids, seq_lens_np)
        self.graphs[bs].replay()
        return self.outputs[bs][:raw_bs]
