from dataclasses import dataclass, field
from typing import Optional, Tuple

import numpy as np
import torch


@dataclass
class ForwardBatch:
    bs: int
    is_decode: bool
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens_cpu: np.ndarray
    qo_indptr_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    kv_indices_np: np.ndarray
    last_page_len: torch.Tensor
    last_page_len_cpu: torch.Tensor
    block_tables: torch.Tensor
    seq_lens_dev: torch.Tensor
    max_kv_len: int = 0
    bucket: int = 0
    use_graph: bool = False
    window_layers: Tuple[int, ...] = field(default_factory=tuple)
    window_indptr_np: Optional[np.ndarray] = None
    window_indices: Optional[torch.Tensor] = None

    @classmethod
    def for_graph(cls, bs, input_ids, positions, block_tables, seq_lens_dev, window_layers):
        zeros_np = np.zeros(bs, dtype=np.int32)
        ones_cpu = torch.ones(bs, dtype=torch.int32)
        return cls(
            bs=bs,
            is_decode=True,
            input_ids=input_ids,
            positions=positions,
            seq_lens_cpu=zeros_np,
            qo_indptr_cpu=torch.arange(bs + 1, dtype=torch.int32),
            kv_indptr_cpu=torch.arange(bs + 1, dtype=torch.int32),
            kv_indices=block_tables[:, 0],
            kv_indices_np=zeros_np,
            last_page_len=seq_lens_dev,
            last_page_len_cpu=ones_cpu,
            block_tables=block_tables,
            seq_lens_dev=seq_lens_dev,
            bucket=bs,
            use_graph=True,
            window_layers=window_layers,
        )
