"""Per-rank decode graphs, one per bucket; every rank replays the same bucket each step."""
from __future__ import annotations

from collections import defaultdict
from typing import DefaultDict, Dict, Optional

import torch

from tpdist import StepMeta, TPConfig
from tp_attn.backend import RankAttnBackend
from tp_run.model import TPModel


class RankGraphRunner:
    def __init__(self, cfg: TPConfig, backend: RankAttnBackend, model: TPModel, device: torch.device):
        self.cfg = cfg
        self.backend = backend
        self.model = model
        max_bs = cfg.largest_bucket
        self.static_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.static_positions = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.static_lens = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.replay_hits = torch.zeros(len(cfg.buckets), dtype=torch.int64, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.replay_counts: DefaultDict[int, int] = defaultdict(int)
        self.pool: Optional[tuple] = None

    def pick(self, real_bs: int) -> int:
        for bs in self.cfg.buckets:
            if bs >= real_bs:
                return bs
        raise ValueError(f"batch {real_bs} above the largest bucket {self.cfg.largest_bucket}")

    def record_all(self) -> None:
        torch.cuda.synchronize()  # ok: FC101
        for bs in reversed(self.cfg.buckets):
            w = self.backend.decode_wrappers[bs]
            indices_buf = w._paged_kv_indices_buf  # expect: FC103
            if indices_buf.data_ptr() != self.backend.kv_indices_buf.data_ptr():
                raise RuntimeError(f"bucket {bs}: indices buffer is not the shared landing buffer")
            if not getattr(w, "is_cuda_graph_enabled", False):  # ok: FC103
                raise RuntimeError(f"bucket {bs}: wrapper is not in CUDA-graph mode")
            self.backend.prepare_capture(bs)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=self.pool):
                self.outputs[bs] = self.model.forward_decode(self.static_ids[:bs], self.static_positions[:bs])
            self.pool = g.pool()
            self.graphs[bs] = g

    def replay(self, meta: StepMeta) -> torch.Tensor:
        real_bs = meta.batch_size
        bs = self.pick(real_bs)
        self.static_ids[:real_bs].copy_(meta.input_ids)
        self.static_positions[:real_bs].copy_(meta.positions)
        self.static_lens[:real_bs].copy_(meta.seq_lens)
        self.backend.prepare_decode(bs, meta)
        self.graphs[bs].replay()
        self.replay_hits[self.cfg.buckets.index(bs)] += 1
        self.replay_counts[bs] += 1
        return self.outputs[bs][:real_bs]

    def replay_summary(self) -> Dict[int, int]:
        hits = self.replay_hits.tolist()  # ok: FC101
        return {bs: hits[i] for i, bs in enumerate(self.cfg.buckets)}
