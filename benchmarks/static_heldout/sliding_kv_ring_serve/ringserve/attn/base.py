"""Backend interface and the per-step batch description."""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np
import torch

from ringserve.config import RingConfig
from ringserve.ring.ring_cache import RingKVCache


@dataclass
class ForwardBatch:
    mode: str  # "decode" or "extend"
    batch_size: int
    request_ids: List[str]
    slots_np: np.ndarray
    seq_lens_np: np.ndarray
    slots_gpu: torch.Tensor
    seq_lens_gpu: torch.Tensor
    input_ids_gpu: torch.Tensor
    positions_gpu: Optional[torch.Tensor] = None
    heads_gpu: Optional[torch.Tensor] = None
    valid_pages_gpu: Optional[torch.Tensor] = None
    last_page_len_cpu: Optional[torch.Tensor] = None
    block_tables_gpu: Optional[torch.Tensor] = None
    extend_indptr_np: Optional[np.ndarray] = None
    global_pages_np: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    global_indices_gpu: Optional[torch.Tensor] = None
    max_seq_len: int = 0
    all_rings_full: bool = False
    crossed_page: bool = True
    out_loc_gpu: Optional[torch.Tensor] = None

    @property
    def is_decode(self) -> bool:
        return self.mode == "decode"


class RingAttnBackend(abc.ABC):
    """What the model and the graph runner need from an attention implementation."""

    name = "base"

    def __init__(self, cfg: RingConfig, cache: RingKVCache, device: torch.device):
        self.cfg = cfg
        self.cache = cache
        self.device = device
        self.sm_scale = cfg.head_dim ** -0.5

    @abc.abstractmethod
    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        """Prepare everything the layers' forward needs for this batch."""

    @abc.abstractmethod
    def forward_decode(self, q, k_cache, v_cache, layer_id: int, is_global: bool) -> torch.Tensor:
        ...

    @abc.abstractmethod
    def forward_extend(self, q, k, v, layer_id: int) -> torch.Tensor:
        ...

    def padded_bs(self, bs: int) -> int:
        return next((size for size in self.cfg.graph_batch_sizes if size >= bs), -1)

    def release_slot(self, slot: int) -> None:
        """Called back by the cache when a request leaves; backends with per-slot state override this."""
