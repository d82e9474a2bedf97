"""Per-step records handed between the builder, the backend and the graphs."""

from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import torch


@dataclass
class FIMeta:
    num_rows: int
    padded: int
    kv_indptr: torch.Tensor  # view of the graph-bound indptr buffer
    kv_indptr_host: torch.Tensor  # pinned
    kv_indices: torch.Tensor  # view of the graph-bound indices buffer
    last_page_len_host: torch.Tensor  # pinned
    seq_lens: torch.Tensor  # on the device, 0 for padding rows
    row_map_cpu: torch.Tensor
    num_real: Optional[torch.Tensor] = None


@dataclass
class Admission:
    num_reqs: int
    qo_indptr: torch.Tensor  # on the device: the prefill rope kernel reads it
    kv_indptr_host: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len_host: torch.Tensor
    input_ids: torch.Tensor
    positions: torch.Tensor
    last_rows: torch.Tensor


def make_admission(
    prompts: List[np.ndarray], tables: List[np.ndarray], page_size: int, device: torch.device
) -> Admission:
    n = len(prompts)
    lens = np.array([len(p) for p in prompts], dtype=np.int32)
    qo = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lens, out=qo[1:])
    kv = np.zeros(n + 1, dtype=np.int32)
    np.cumsum([len(t) for t in tables], out=kv[1:])
    last = ((lens - 1) % page_size + 1).astype(np.int32)
    pos = np.concatenate([np.arange(k, dtype=np.int64) for k in lens])
    return Admission(
        num_reqs=n,
        qo_indptr=torch.from_numpy(qo).to(device),
        kv_indptr_host=torch.from_numpy(kv),
        kv_indices=torch.from_numpy(np.concatenate(tables).astype(np.int32)).to(device, non_blocking=True),
        last_page_len_host=torch.from_numpy(last),
        input_ids=torch.from_numpy(np.concatenate(prompts)).to(device, non_blocking=True),
        positions=torch.from_numpy(pos).to(device, non_blocking=True),
        last_rows=torch.from_numpy(qo[1:].astype(np.int64) - 1).to(device, non_blocking=True),
    )
