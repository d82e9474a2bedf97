"""CUDA graphs of the offline server: one prefill graph per padded length, one decode graph for the full
static batch and one refill graph (new rows' prefill fused with the old rows' decode)."""
from __future__ import annotations

import logging
from typing import Dict, List, Optional

import torch

from bapi.config import OfflineConfig
from bapi_runtime.attention import OfflineAttention
from bapi_runtime.metadata import DecodeMetadata, StaticBatchMetadata
from bapi_runtime.model import OfflineLM

logger = logging.getLogger(__name__)


class PaddedGraphCache:
    def __init__(self, model: OfflineLM, attn: OfflineAttention, kv_cache: List[torch.Tensor],
                 cfg: OfflineConfig, device: torch.device):
        self.model, self.attn, self.kv_cache, self.cfg, self.device = model, attn, kv_cache, cfg, device
        rows, n_max = cfg.batch_rows, cfg.batch_rows * max(cfg.padded_lengths)
        self.static_ids = torch.zeros(n_max, dtype=torch.int64, device=device)
        self.static_positions = torch.zeros(n_max, dtype=torch.int64, device=device)
        self.static_last_idx = torch.zeros(rows, dtype=torch.int64, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.row_capacity: Dict[int, int] = {}
        self.decode_graph: Optional[torch.cuda.CUDAGraph] = None
        self.refill_graph: Optional[torch.cuda.CUDAGraph] = None
        self.pool = None

    def capture_all(self) -> None:
        for L in sorted(self.cfg.padded_lengths, reverse=True):
            self.capture_padded_length(L)
        self.capture_decode()
        self.capture_refill()

    def capture_padded_length(self, L: int) -> None:
        rows = self.cfg.batch_rows
        n = rows * L
        self.attn.plan_prefill_graph(L, rows)
        self.row_capacity[L] = self.attn.prefill_graph[L]._max_total_num_rows  # expect: FC103
        torch.cuda.synchronize()  # ok: FC101
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            out = self.model.prefill_forward(
                self.static_ids[:n], self.static_positions[:n], self.attn, self.kv_cache, self.static_last_idx
            )
        self.pool, self.graphs[L], self.outputs[L] = g.pool(), g, out

    def capture_decode(self) -> None:
        rows = self.cfg.batch_rows
        self.attn.plan_decode_graph(rows)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            out = self.model.decode_forward(self.static_ids[:rows], self.static_positions[:rows], self.attn, self.kv_cache)
        self.pool, self.decode_graph, self.outputs[0] = g.pool(), g, out

    def capture_refill(self) -> None:
        cfg = self.cfg
        n_prefill, n_decode = cfg.refill_rows * cfg.refill_len, cfg.batch_rows - cfg.refill_rows
        self.attn.plan_refill(n_decode, torch.ones(n_decode, dtype=torch.int32))
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            out = self.model.mixed_forward(
                self.static_ids[: n_prefill + n_decode], self.static_positions[: n_prefill + n_decode], n_prefill,
                self.attn, self.kv_cache,
            )
        self.pool, self.refill_graph, self.outputs[-1] = g.pool(), g, out

    def replay(self, L: int, md: StaticBatchMetadata) -> torch.Tensor:
        if (md.seq_lens > L).any():  # expect: FC101
            raise ValueError(f"a row is longer than its padded length {L}")
        logger.debug("replay L=%d seq_lens=%s", L, md.seq_lens)  # ok: FC101
        n = md.rows * L
        if self.static_ids.numel() != n:
            self.static_ids.resize_(n)  # expect: FC107
        self.static_ids.copy_(md.input_ids)
        self.static_positions[:n].copy_(md.positions)
        self.static_last_idx[: md.rows].copy_(md.qo_indptr[:-1] + md.seq_lens - 1)
        self.graphs[L].replay()
        return self.outputs[L][: md.rows]

    def replay_decode(self, dmd: DecodeMetadata, next_ids: torch.Tensor) -> torch.Tensor:
        self.static_ids[: dmd.rows].copy_(next_ids)
        self.static_positions[: dmd.rows].copy_(dmd.positions)
        self.decode_graph.replay()
        return self.outputs[0][: dmd.rows]
