"""Brings a freshly started engine back to where the snapshot left it, before serving resumes."""
from __future__ import annotations

import logging
import os
from typing import List

import numpy as np
import torch

from warmstart.attn.trtllm_paths import TailRecompute, verify_restored_pages
from warmstart.snapshot.reader import SnapshotReader
from warmstart_rt.model_runner import ModelRunner
from warmstart_rt.scheduler import Scheduler

logger = logging.getLogger(__name__)


class WarmRestartCoordinator:
    def __init__(self, runner: ModelRunner, scheduler: Scheduler, directory: str):
        self.runner = runner
        self.scheduler = scheduler
        self.directory = directory
        self.tails = TailRecompute(runner.cfg, runner.device)

    def _running_page_counts(self) -> np.ndarray:
        P = self.runner.cfg.page_size
        return np.asarray([(r.seq_len + P - 1) // P for r in self.scheduler.running], dtype=np.int64)

    def restore_page_table(self) -> None:
        """The reinstalled plans skip the first re-plan: put the resumed rows' page ids where the
        recorded graphs read them."""
        backend = self.runner.attn_backend
        rows = torch.tensor([r.row for r in self.scheduler.running], dtype=torch.int64)
        flat = self.runner.req_to_page.gather_host(rows, self._running_page_counts())
        backend.cuda_graph_kv_indices[: flat.numel()].copy_(flat, non_blocking=True)  # expect: FC104

    def _graph_seq_lens(self) -> torch.Tensor:
        gr = self.runner.graph_runner
        lens = [r.seq_len for r in self.scheduler.running][: gr.max_bs]
        lens += [1] * (gr.max_bs - len(lens))
        return torch.tensor(lens, dtype=torch.int32, device=self.runner.device)

    def spot_check(self, probes: int = 8) -> List[int]:
        cfg = self.runner.cfg
        running = self.scheduler.running[:probes]
        if not running:
            return []
        P = cfg.page_size
        width = max((r.seq_len + P - 1) // P for r in running)
        tables = np.zeros((len(running), width), dtype=np.int32)
        for i, r in enumerate(running):
            n = (r.seq_len + P - 1) // P
            tables[i, :n] = self.runner.req_to_page.table_np[r.row, :n]
        dev = self.runner.device
        q = torch.ones(len(running), cfg.num_qo_heads, cfg.head_dim, dtype=cfg.dtype, device=dev)
        seq_lens = torch.tensor([r.seq_len for r in running], dtype=torch.int32, device=dev)
        digests = [float(r.seq_len) for r in running]
        return verify_restored_pages(
            cfg, q, self.runner.kv_pool.kv(0), torch.from_numpy(tables).to(dev), seq_lens, width * P, digests
        )

    def restore(self) -> bool:
        if not os.path.exists(os.path.join(self.directory, "manifest.json")):
            return False
        cfg = self.runner.cfg
        reader = SnapshotReader(cfg, self.directory)
        manifest = reader.manifest
        pool = self.runner.kv_pool
        page_ids = reader.page_ids()
        for layer in range(manifest.num_layers):
            k, v = reader.load_layer(layer)
            reader.restore_pages(pool, layer, page_ids, k, v)
        taken = set(page_ids.tolist())
        pool.free_pages = [p for p in range(cfg.max_total_pages - 1, -1, -1) if p not in taken]
        self.runner.req_to_page.load(reader.req_to_page(), self.runner.device)

        backend = self.runner.attn_backend
        backend.restore_generation = manifest.restore_generation + 1
        self.scheduler.from_state(manifest.scheduler_state, backend.restore_generation)
        fills = torch.tensor([v[2] for v in manifest.requests.values()], dtype=torch.int32)
        backend.set_restored_last_page_len(fills.to(self.runner.device))

        graph_runner = self.runner.graph_runner
        graph_runner.restored_seq_lens = self._graph_seq_lens()
        graph_runner.capture()
        reinstalled = reader.reinstall_wrapper_state(backend, reader.wrapper_state())
        self.restore_page_table()
        torch.cuda.synchronize()  # ok: FC101
        bad = self.spot_check()
        if bad:
            raise RuntimeError(f"restored pages of {len(bad)} probed requests do not match the snapshot")
        logger.info(
            "warm restart: %d pages, %d running, %d waiting, %d wrapper plans reinstalled",
            page_ids.numel(), len(self.scheduler.running), len(self.scheduler.waiting), reinstalled,
        )
        return True
