"""Head-sharded paged KV: each rank stores its kv heads for every token; residual heads are replicated."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import torch

from ulysses.config import UlyssesConfig, split_heads


@dataclass
class SPBatch:
    request_ids: List[str]
    is_prefill: bool
    seq_lens_cpu: torch.Tensor  # global length of each request after this step
    local_lens_cpu: torch.Tensor  # new tokens of each request held by this rank
    local_lens_gpu: torch.Tensor
    page_counts_cpu: np.ndarray
    last_page_len_cpu: torch.Tensor
    page_ids_gpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    input_ids_gpu: torch.Tensor  # this rank's token shard
    positions_gpu: torch.Tensor
    out_loc_gpu: torch.Tensor  # slots of all tokens (after the all-to-all every rank writes every token)
    block_tables_gpu: Optional[torch.Tensor] = None


class HeadShardedKV:
    def __init__(self, cfg: UlyssesConfig, rank: int, world: int, device: torch.device):
        self.cfg = cfg
        self.kv_heads, self.residual = split_heads(cfg.num_kv_heads, world)
        shape = (cfg.num_pages, 2, cfg.page_size, self.kv_heads, cfg.head_dim)
        self.kv = [torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(cfg.num_layers)]
        tail_shape = (cfg.num_pages, 2, cfg.page_size, max(self.residual, 1), cfg.head_dim)
        self.tail = [torch.zeros(tail_shape, dtype=torch.bfloat16, device=device) for _ in range(cfg.num_layers)]

    def layer(self, layer_id: int) -> torch.Tensor:
        return self.kv[layer_id]

    def tail_layer(self, layer_id: int) -> torch.Tensor:
        return self.tail[layer_id]

    def store(self, layer_id: int, k: torch.Tensor, v: torch.Tensor, out_loc: torch.Tensor) -> None:
        ps = self.cfg.page_size
        page, off = out_loc // ps, out_loc % ps
        kv = self.kv[layer_id]
        kv[page, 0, off] = k[:, : self.kv_heads]
        kv[page, 1, off] = v[:, : self.kv_heads]
        if self.residual:
            self.tail[layer_id][page, 0, off] = k[:, self.kv_heads :]
            self.tail[layer_id][page, 1, off] = v[:, self.kv_heads :]
