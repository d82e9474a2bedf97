from __future__ import annotations

import bisect
import logging
import math
from typing import Dict

import numpy as np
import torch

from bbserve.attn.backend import WindowGlobalBackend
from bbserve.config import EngineConfig
from bbserve.engine.batch import DecodeBatch
from bbserve.model import BigBirdLM
from bbserve.sparse.selector import GlobalSelection

logger = logging.getLogger(__name__)


class SparseGraphRunner:
    def __init__(self, cfg: EngineConfig, model: BigBirdLM, backend: WindowGlobalBackend, device: torch.device):
        self.cfg = cfg
        self.model = model
        self.backend = backend
        self.device = device
        self.batch_sizes = [b for b in (1, 2, 4, 8, 16, 32, 48, 64) if b <= cfg.max_graph_bs]
        max_bs = self.batch_sizes[-1]
        self.static_input_ids = torch.zeros(max_bs, dtype=torch.int64, device=self.device)
        self.static_seq_lens = torch.full((max_bs,), cfg.window + cfg.block_size, dtype=torch.int32, device=self.device)
        self.per_row = cfg.num_global_blocks + cfg.max_adaptive_blocks
        self.static_global_pos = torch.zeros(max_bs * self.per_row, dtype=torch.int64, device=self.device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.pool = None

    def can_run(self, bs: int) -> bool:
        return bs <= self.batch_sizes[-1]

    def bucket(self, bs: int) -> int:
        return self.batch_sizes[bisect.bisect_left(self.batch_sizes, bs)]

    def _dummy(self, bs: int, max_blocks: int):
        P = self.cfg.page_size
        pages = max_blocks * (self.cfg.block_size // P)
        seq_np = np.full(bs, pages * P, dtype=np.int64)
        table_np = np.tile(np.arange(pages, dtype=np.int32), (bs, 1))
        batch = DecodeBatch(
            batch_size=bs,
            input_ids=self.static_input_ids[:bs],
            positions=torch.from_numpy(seq_np - 1).to(self.device),
            seq_lens=self.static_seq_lens[:bs],
            seq_lens_np=seq_np,
            page_table=torch.from_numpy(table_np).to(self.device),
            page_table_np=table_np,
            query_summary=torch.zeros(bs, self.cfg.num_qo_heads, self.cfg.head_dim, device=self.device),
            key_cache=torch.empty(0, device=self.device),
            max_seq_len=pages * P,
        )
        per_row = (self.cfg.num_global_blocks + self.cfg.max_adaptive_blocks) * (self.cfg.block_size // P)
        sel = GlobalSelection(
            page_ids=self.backend.glob_kv_indices[: bs * per_row],
            counts=torch.full((bs,), per_row, dtype=torch.int32, device=self.device),
            counts_cpu=np.full(bs, per_row, dtype=np.int32),
            random_indptr_cpu=np.zeros(bs + 1, dtype=np.int32),
            random_pages_cpu=np.zeros(0, dtype=np.int32),
            block_pos=torch.zeros(bs, self.per_row, dtype=torch.int64, device=self.device),
        )
        return batch, sel

    def capture_all(self) -> None:
        self.backend.init_graph_wrappers(self.batch_sizes)
        for bs in reversed(self.batch_sizes):
            max_blocks = math.ceil(self.static_seq_lens[:bs].max() / self.cfg.block_size)  # expect: FC101
            batch, sel = self._dummy(bs, max_blocks)
            self.backend.prepare_replay(bs, batch)
            self.backend.plan_global(bs, batch, sel)
            torch.cuda.synchronize()  # ok: FC101
            graph = torch.cuda.CUDAGraph()
            self.backend.graph_bs = bs
            with torch.cuda.graph(graph, pool=self.pool):
                out = self.model.decode(self.static_input_ids[:bs], self.static_global_pos[: bs * self.per_row], bs)
            self.backend.graph_bs = None
            if self.pool is None:
                self.pool = graph.pool()
            self.graphs[bs] = graph
            self.outputs[bs] = out
        logger.info("captured %d window/global decode graphs", len(self.graphs))

    def replay(self, batch: DecodeBatch, sel: GlobalSelection) -> torch.Tensor:
        raw = batch.batch_size
        bs = self.bucket(raw)
        pos = sel.block_pos.flatten()
        n = pos.shape[0]
        if n > self.static_global_pos.numel():
            self.static_global_pos = torch.zeros(n, dtype=torch.int64, device=self.device)  # expect: FC107
        self.static_global_pos[:n].copy_(pos)
        self.static_input_ids[:raw].copy_(batch.input_ids)
        self.static_seq_lens[:raw].copy_(batch.seq_lens)
        self.backend.prepare_replay(bs, batch)
        self.backend.plan_global(bs, batch, sel)
        self.graphs[bs].replay()
        return self.outputs[bs][:raw]

    def replay_debug_dump(self, bs: int) -> None:
        """Print what the bs graph will read on its next replay (ops tooling only)."""
        w_nnz = self.backend.win_kv_indptr[bs].item()  # ok: FC101
        g_nnz = int(self.backend.glob_kv_indptr_host[bs])
        print(f"bs={bs}: window pages={w_nnz} global pages={g_nnz}")
