"""Per-step metadata of the query phase (phase 2)."""

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from staratt import ContextLayout, StarConfig


@dataclass
class StepBatch:
    """What the scheduler hands the backend for one phase-2 step."""

    batch_size: int
    context_len: int
    input_ids: torch.Tensor  # device, flattened tokens of the step
    positions: torch.Tensor  # device, flattened positions of the step
    query_lens: torch.Tensor  # device, tokens per request this step
    kv_indices: torch.Tensor  # device, this host's page ids, packed per request
    kv_page_counts_cpu: np.ndarray  # pages per request on this host
    seq_lens_cpu: np.ndarray  # tokens per request on this host
    layout: ContextLayout
    is_decode: bool = True


@dataclass
class QueryStepMeta:
    batch_size: int
    kv_indptr: torch.Tensor  # device view of the builder's indptr
    kv_indptr_host: torch.Tensor  # pinned view
    last_page_len_host: torch.Tensor  # pinned view
    num_pages: int
    window_tokens: int
    query_positions: Optional[torch.Tensor] = None


class QueryMetadataBuilder:
    def __init__(self, cfg: StarConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        n = cfg.max_batch_size
        self.kv_indptr = torch.zeros(n + 1, dtype=torch.int32, device=device)
        self.kv_indptr_host = torch.zeros(n + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_host = torch.ones(n, dtype=torch.int32, pin_memory=True)
        self._indptr_np = self.kv_indptr_host.numpy()
        self._last_np = self.last_page_len_host.numpy()
        self._plan_info: Optional[dict] = None

    def build(self, batch: StepBatch, pad_to: Optional[int] = None) -> QueryStepMeta:
        bs = batch.batch_size
        rows = pad_to or bs
        # the anchor window of phase 2 never exceeds the longest local block
        window = min(int(batch.layout.longest_block), self.cfg.anchor_tokens)  # expect: FC101
        self._indptr_np[0] = 0
        np.cumsum(batch.kv_page_counts_cpu[:bs], out=self._indptr_np[1 : bs + 1])
        self._indptr_np[bs + 1 : rows + 1] = self._indptr_np[bs]
        self._last_np[:bs] = (batch.seq_lens_cpu[:bs] - 1) % self.cfg.page_size + 1
        self._last_np[bs:rows] = 1
        self.kv_indptr[: rows + 1].copy_(self.kv_indptr_host[: rows + 1], non_blocking=True)
        num_pages = int(self._indptr_np[bs])
        self._plan_info = {"rows": rows, "pages": num_pages}  # ok: FC103
        return QueryStepMeta(
            batch_size=bs,
            kv_indptr=self.kv_indptr[: rows + 1],
            kv_indptr_host=self.kv_indptr_host[: rows + 1],
            last_page_len_host=self.last_page_len_host[:rows],
            num_pages=num_pages,
            window_tokens=window,
        )
