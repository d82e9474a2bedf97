"""Writes a snapshot of a running engine (on SIGTERM, and periodically from the admin loop)."""
from __future__ import annotations

import os
import pickle
from typing import Dict

import numpy as np
import torch

from warmstart.snapshot.manifest import FORMAT_VERSION, SnapshotManifest


class SnapshotWriter:
    def __init__(self, directory: str):
        self.directory = directory

    def _collect_wrapper_state(self, backend) -> Dict[int, object]:
        # plans of the graph-mode wrappers, so the first replays after a restart need no re-plan
        state: Dict[int, object] = {}
        for bs, w in backend.decode_cuda_graph_wrappers.items():
            state[bs] = w._plan_info  # expect: FC103
        return state

    def persist(self, runner, scheduler) -> SnapshotManifest:
        os.makedirs(self.directory, exist_ok=True)
        torch.cuda.current_stream().synchronize()
        pool = runner.kv_pool
        used = pool.used_pages()
        idx = torch.from_numpy(used).to(runner.device)
        for layer in range(runner.cfg.num_layers):
            k = pool.k_buffer[layer].index_select(0, idx).cpu()  # ok: FC101
            v = pool.v_buffer[layer].index_select(0, idx).cpu()
            np.save(os.path.join(self.directory, f"k{layer}.npy"), k.view(torch.int16).numpy())
            np.save(os.path.join(self.directory, f"v{layer}.npy"), v.view(torch.int16).numpy())
        np.save(os.path.join(self.directory, "pages.npy"), used)
        np.save(os.path.join(self.directory, "req_to_page.npy"), runner.req_to_page.table_np)
        with open(os.path.join(self.directory, "wrappers.pkl"), "wb") as f:
            pickle.dump(self._collect_wrapper_state(runner.attn_backend), f)
        cfg = runner.cfg
        manifest = SnapshotManifest(
            version=FORMAT_VERSION,
            num_layers=cfg.num_layers,
            page_size=cfg.page_size,
            num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            dtype=str(cfg.dtype),
            used_pages=int(used.size),
            restore_generation=runner.attn_backend.restore_generation,
            graph_batch_sizes=sorted(runner.attn_backend.decode_cuda_graph_wrappers),
            requests=scheduler.request_rows(),
            scheduler_state=scheduler.to_state(),
        )
        manifest.save(self.directory)
        return manifest
