"""Two paged KV pools (bf16 and fp8 e4m3 with per-page scales) and a bf16 side pool for outlier layers."""

from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np
import torch

from qswitch.config import SwitchConfig
from qswitch.dtypes import KV_TORCH_DTYPE, KVClass


class QuantKVPool:
    def __init__(self, cfg: SwitchConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self._kv_layout = "HND"
        self.page_size = cfg.page_size
        sizes = {KVClass.BF16: cfg.bf16_pages, KVClass.FP8: cfg.fp8_pages}
        self.kv: Dict[KVClass, List[torch.Tensor]] = {
            k: [
                torch.zeros((n, 2, cfg.num_kv_heads, cfg.page_size, cfg.head_dim), dtype=KV_TORCH_DTYPE[k], device=device)
                for _ in range(cfg.num_layers)
            ]
            for k, n in sizes.items()
        }
        self.side_kv = {
            layer: torch.zeros((cfg.fp8_pages, 2, cfg.num_kv_heads, cfg.page_size, cfg.head_dim), dtype=torch.bfloat16, device=device)
            for layer in cfg.fp8_outlier_layers
        }
        self.free: Dict[KVClass, List[int]] = {k: list(range(n - 1, -1, -1)) for k, n in sizes.items()}
        self.pages: Dict[str, List[int]] = {}
        self.lens: Dict[str, int] = {}

    @property
    def num_fp8_pages(self) -> int:
        return self.cfg.fp8_pages - len(self.free[KVClass.FP8])

    def layer(self, kv_class: KVClass, layer_id: int) -> torch.Tensor:
        return self.kv[kv_class][layer_id]

    def alloc(self, rid: str, kv_class: KVClass, num_tokens: int) -> None:
        need = -(-num_tokens // self.page_size)
        self.pages[rid] = [self.free[kv_class].pop() for _ in range(need)]
        self.lens[rid] = num_tokens

    def grow(self, rid: str, kv_class: KVClass) -> None:
        self.lens[rid] += 1
        if (self.lens[rid] - 1) % self.page_size == 0:
            self.pages[rid].append(self.free[kv_class].pop())

    def release(self, rid: str, kv_class: KVClass) -> None:
        self.free[kv_class].extend(self.pages.pop(rid, []))
        self.lens.pop(rid, None)

    def tables(self, rids: List[str]) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(indptr, flat page ids, last-page lengths, seq lens) on the host."""
        counts = np.array([len(self.pages[r]) for r in rids], dtype=np.int32)
        indptr = np.zeros(len(rids) + 1, dtype=np.int32)
        np.cumsum(counts, out=indptr[1:])
        flat = np.concatenate([np.asarray(self.pages[r], dtype=np.int32) for r in rids])
        lens = np.array([self.lens[r] for r in rids], dtype=np.int32)
        last = ((lens - 1) % self.page_size + 1).astype(np.int32)
        return indptr, flat, last, lens

    def block_table(self, rids: List[str], width: int) -> np.ndarray:
        table = np.zeros((len(rids), width), dtype=np.int32)
        for i, r in enumerate(rids):
            table[i, : len(self.pages[r])] = self.pages[r]
        return table
