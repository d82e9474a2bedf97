"""The serving engine: prefill under the window, decode with window + global + random pages."""
from __future__ import annotations

import logging
from collections import defaultdict
from typing import Dict, List

import numpy as np
import torch

from bbserve.attn.backend import WindowGlobalBackend
from bbserve.config import EngineConfig
from bbserve.engine.batch import DecodeBatch, PrefillBatch
from bbserve.engine.graph_runner import SparseGraphRunner
from bbserve.model import BigBirdLM
from bbserve.sparse.kernels import slide_window_kernel
from bbserve.sparse.selector import GlobalBlockSelector

logger = logging.getLogger(__name__)


class StepMetrics:
    def __init__(self):
        self.values: Dict[str, List[float]] = defaultdict(list)

    def observe(self, name: str, value) -> None:
        self.values[name].append(value)


class SparseEngine:
    def __init__(self, cfg: EngineConfig, device_index: int = 0):
        self.cfg = cfg
        self.device = torch.device("cuda", device_index)
        self.backend = WindowGlobalBackend(cfg, self.device)
        self.model = BigBirdLM(cfg, self.backend).to(self.device)
        self.selector = GlobalBlockSelector(
            self.backend,
            cfg.block_size,
            cfg.num_global_blocks,
            cfg.num_random_blocks,
            cfg.max_adaptive_blocks,
            cfg.score_threshold,
            seed=cfg.seed,
        )
        self.runner = SparseGraphRunner(cfg, self.model, self.backend, self.device)
        self.metrics = StepMetrics()
        self._free: List[int] = list(range(cfg.num_pages))
        self._num_free = cfg.num_pages

    # -- pages -------------------------------------------------------------------------

    def _alloc_pages(self, n: int) -> List[int]:
        assert self._num_free == len(self._free)  # ok: FC109
        if n > self._num_free:
            raise MemoryError(f"need {n} KV pages, {self._num_free} free")
        out, self._free = self._free[:n], self._free[n:]
        self._num_free -= n
        return out

    def free_pages(self, pages: List[int]) -> None:
        self._free.extend(pages)
        self._num_free += len(pages)

    # -- steps -------------------------------------------------------------------------

    def prefill(self, prompts: List[List[int]]) -> torch.Tensor:
        lens = [len(p) for p in prompts]
        cu = np.zeros(len(prompts) + 1, dtype=np.int32)
        np.cumsum(lens, out=cu[1:])
        for n in lens:
            self._alloc_pages((n + self.cfg.page_size - 1) // self.cfg.page_size)
        ids = torch.tensor([t for p in prompts for t in p], dtype=torch.int64, device=self.device)
        batch = PrefillBatch(
            input_ids=ids,
            positions=torch.cat([torch.arange(n, device=self.device) for n in lens]),
            cu_seqlens=torch.from_numpy(cu).cuda(),
            num_tokens=int(cu[-1]),
        )
        self.backend.plan_prefill(batch)
        return self.model.prefill(batch.input_ids)

    def advance_windows(self, batch: DecodeBatch) -> None:
        """Slide every row's window page ids forward for its next token, on the device."""
        bs = batch.batch_size
        slide_window_kernel[(bs,)](self.backend.win_kv_indices, self.backend.win_kv_indptr, batch.page_table, batch.seq_lens, batch.page_table.stride(0), PAGE=self.cfg.page_size, WIN_PAGES=self.cfg.window_pages)  # expect: FC104

    def decode_step(self, batch: DecodeBatch) -> torch.Tensor:
        sel = self.selector.select(batch)
        n_global = sum(sel.counts)  # expect: FC101
        self.metrics.observe("global_pages", n_global)
        if self.runner.can_run(batch.batch_size):
            logits = self.runner.replay(batch, sel)
        else:
            self.backend.plan_eager(batch, sel)
            logits = self.model.decode(batch.input_ids, sel.block_pos.flatten(), None)
        self.advance_windows(batch)
        return logits
