"""Owns the pool, backend, model and graphs of one CLA worker."""
from __future__ import annotations

import logging
import time
from typing import Dict, List, Sequence

import numpy as np
import torch

from clashare.attn.backend import CLAFlashInferBackend
from clashare.config import CLAConfig
from clashare.groups import LayerGroupMap
from clashare.kv.group_pool import GroupKVPool
from clashare_rt.forward_batch import ForwardBatch
from clashare_rt.graph_runner import CudaGraphRunner
from clashare_rt.model import CLAModel

logger = logging.getLogger(__name__)


class ModelRunner:
    def __init__(self, cfg: CLAConfig, device: str = "cuda") -> None:
        self.cfg = cfg
        self.device = torch.device(device)
        self.group_map = LayerGroupMap(cfg.num_layers, cfg.cla_factor, cfg.local_group_every)
        self.pool = GroupKVPool(cfg, self.group_map, self.device)
        self.backend = CLAFlashInferBackend(cfg, self.group_map, self.pool, self.device)
        self.model = CLAModel(cfg, self.group_map, self.backend).to(self.device)
        self.graph_runner = CudaGraphRunner(self)

    def make_batch(self, rows: Sequence[int], seq_lens: Sequence[int], token_ids: Sequence[int], is_decode: bool) -> ForwardBatch:
        lens_np = np.asarray(seq_lens, dtype=np.int32)
        rows_np = np.asarray(rows, dtype=np.int64)
        n = len(rows_np)
        if is_decode:
            positions_np = lens_np.astype(np.int64) - 1
            qo_np = np.arange(n + 1, dtype=np.int32)
        else:
            positions_np = np.concatenate([np.arange(s, dtype=np.int64) for s in lens_np])
            qo_np = np.zeros(n + 1, dtype=np.int32)
            np.cumsum(lens_np, out=qo_np[1:])
        slots_np = self._slots_for(rows_np, positions_np, qo_np)
        return ForwardBatch(
            is_decode=is_decode,
            batch_size=n,
            input_ids=torch.tensor(list(token_ids), dtype=torch.int64, device=self.device),
            positions=torch.from_numpy(positions_np).to(self.device),
            seq_lens=torch.tensor(lens_np, dtype=torch.int32, device=self.device),
            seq_lens_cpu=torch.from_numpy(lens_np),
            req_rows=torch.from_numpy(rows_np).to(self.device),
            req_rows_cpu=torch.from_numpy(rows_np),
            out_cache_loc=torch.from_numpy(slots_np).to(self.device),
            qo_indptr=torch.tensor(qo_np, device=self.device),
            qo_indptr_cpu=torch.from_numpy(qo_np),
            max_seq_len_cpu=int(lens_np.max()) if n else 0,
        )

    def _slots_for(self, rows: np.ndarray, positions: np.ndarray, qo_indptr: np.ndarray) -> np.ndarray:
        ps = self.cfg.page_size
        table = self.pool.page_table_np[0]
        req_of_tok = np.repeat(rows, np.diff(qo_indptr))
        return (table[req_of_tok, positions // ps].astype(np.int64) * ps + positions % ps)

    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        if self.graph_runner.can_run(fb):
            return self.graph_runner.replay(fb)
        self.backend.init_forward_metadata(fb)
        if fb.is_decode:
            return self.model.decode_tokens(fb.input_ids, fb)
        return self.model.extend_tokens(fb.input_ids, fb)

    def release_requests(self, rows: List[int]) -> None:
        for g in range(self.backend.num_groups):
            self.pool.free_rows(g, rows)
        # freed pages must not stay reachable from the graphs' index buffer
        self.backend.graph_kv_indices.zero_()  # expect: FC104
        self.backend.plan_cache.clear()

    def report_group_usage(self) -> Dict[str, List[int]]:
        used = (self.pool.num_pages_dev > 0).sum(dim=1)
        return {"requests_per_group": used.tolist()}  # ok: FC101


def serve_forever(runner: ModelRunner, poll_s: float = 10.0) -> None:
    """Metrics loop of the admin thread; the step loop lives in the scheduler."""
    while True:
        logger.info("cla usage %s, workspace %s", runner.report_group_usage(), runner.backend.workspace_report())
        time.sleep(poll_s)
