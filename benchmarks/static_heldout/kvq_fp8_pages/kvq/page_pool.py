"""FP8 KV pages with per-page scales.

Each page remembers the layer scale it was quantized with (`page_scale`). When new tokens push a layer's amax past
its scale, the layer scale is raised and every page written under an older scale is requantized (requant.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List

import torch

FP8_MAX = 448.0


@dataclass(frozen=True)
class KVQuantConfig:
    num_layers: int
    num_pages: int
    page_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_bs: int
    max_pages_per_seq: int
    sensitive_heads: tuple = (0,)
    max_kv_splits: int = 16


@dataclass
class DecodeBatch:
    batch_size: int
    input_ids: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    kv_indices: torch.Tensor
    block_tables: torch.Tensor
    new_page_amax: List[torch.Tensor]  # per layer: [num_pages, 2] amax of what this step wrote, 0 elsewhere

    @classmethod
    def build(cls, ids: List[int], lens: List[int], pages: List[List[int]], amax, device) -> "DecodeBatch":
        width = max(len(p) for p in pages)
        lens_cpu = torch.tensor(lens, dtype=torch.int32, pin_memory=True)
        return cls(len(ids), torch.tensor(ids, device=device), lens_cpu.to(device, non_blocking=True), lens_cpu,
                   torch.tensor([p for row in pages for p in row], dtype=torch.int32, device=device),
                   torch.tensor([r + [0] * (width - len(r)) for r in pages], dtype=torch.int32, device=device), amax)


class QuantPagePool:
    layout = "NHD"

    def __init__(self, cfg: KVQuantConfig, device: torch.device) -> None:
        L, P, ps = cfg.num_layers, cfg.num_pages, cfg.page_size
        self.kv_pages = torch.zeros(L, P, 2, ps, cfg.num_kv_heads, cfg.head_dim, dtype=torch.float8_e4m3fn, device=device)
        # bf16 copy of the quantization-sensitive heads, read by the shadow decode
        self.shadow_kv = torch.zeros(L, P, 2, ps, len(cfg.sensitive_heads), cfg.head_dim, dtype=torch.bfloat16,
                                     device=device)
        self.k_scale = torch.ones(L, dtype=torch.float32, device=device)
        self.v_scale = torch.ones(L, dtype=torch.float32, device=device)
        self.page_scale = torch.ones(L, P, 2, dtype=torch.float32, device=device)
        self._free: List[int] = list(range(P))

    @property
    def free_pages(self) -> int:
        return len(self._free)

    def alloc(self, n: int) -> List[int]:
        assert n <= len(self._free), "KV page pool exhausted"  # expect: FC109
        pages, self._free = self._free[:n], self._free[n:]
        return pages

    def release(self, pages: List[int]) -> None:
        self._free.extend(pages)
        self._check()

    def _check(self) -> None:
        assert len(self._free) <= self.page_scale.shape[1], "page released twice"  # ok: FC109
