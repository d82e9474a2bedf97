"""Loads a snapshot back into a freshly started engine."""
from __future__ import annotations

import os
import pickle
from typing import Dict

import numpy as np
import torch

from warmstart.config import RestartConfig
from warmstart.snapshot.manifest import SnapshotManifest


class SnapshotReader:
    def __init__(self, cfg: RestartConfig, directory: str):
        self.cfg = cfg
        self.directory = directory
        self.manifest = SnapshotManifest.load(directory)
        self._check_layout()

    def _check_layout(self) -> None:
        assert self.manifest.page_size == self.cfg.page_size  # ok: FC109
        if self.manifest.num_kv_heads != self.cfg.num_kv_heads or self.manifest.head_dim != self.cfg.head_dim:
            raise RuntimeError("snapshot was taken with another KV layout")

    def load_layer(self, layer: int) -> tuple:
        k = np.load(os.path.join(self.directory, f"k{layer}.npy"))
        v = np.load(os.path.join(self.directory, f"v{layer}.npy"))
        return torch.from_numpy(k).view(self.cfg.dtype), torch.from_numpy(v).view(self.cfg.dtype)

    def page_ids(self) -> torch.Tensor:
        return torch.from_numpy(np.load(os.path.join(self.directory, "pages.npy")))

    def req_to_page(self) -> np.ndarray:
        return np.load(os.path.join(self.directory, "req_to_page.npy"))

    def restore_pages(self, pool, layer: int, page_ids: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        assert page_ids.numel() == k.shape[0] == v.shape[0]  # expect: FC109
        dev = pool.k_buffer[layer].device
        idx = page_ids.to(dev, non_blocking=True)
        pool.k_buffer[layer].index_copy_(0, idx, k.pin_memory().to(dev, non_blocking=True))
        pool.v_buffer[layer].index_copy_(0, idx, v.pin_memory().to(dev, non_blocking=True))

    def wrapper_state(self) -> Dict[int, object]:
        path = os.path.join(self.directory, "wrappers.pkl")
        if not os.path.exists(path):
            return {}
        with open(path, "rb") as f:
            return pickle.load(f)

    def reinstall_wrapper_state(self, backend, state: Dict[int, object]) -> int:
        done = 0
        for bs, w in backend.decode_cuda_graph_wrappers.items():
            if bs in state:
                setattr(w, "_plan_info", state[bs])  # expect: FC103
                done += 1
        return done
