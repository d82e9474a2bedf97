import logging
from dataclasses import dataclass
from typing import List, Optional, Tuple

import numpy as np
import torch

from beamserve.beam_state import BeamRequest, BeamTable
from beamserve.config import BeamConfig

logger = logging.getLogger(__name__)


@dataclass
class BeamDecodeMetadata:
    batch: int
    beam: int
    rows: int
    kv_indptr: torch.Tensor
    kv_indptr_host: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len_host: torch.Tensor
    beam_scores: torch.Tensor
    parent_rows: torch.Tensor
    wide: bool = False
    graph_key: Optional[Tuple[int, int]] = None
    qo_indptr_host: Optional[torch.Tensor] = None


class BeamMetadataBuilder:
    """Rebuilds the per-beam page tables on the host every step, after forks and prunes."""

    def __init__(self, cfg: BeamConfig, table: BeamTable, backend, device: torch.device):
        self.cfg = cfg
        self.table = table
        self.backend = backend
        self.device = device
        self._plan_info = None  # ok: FC103

    def build(self, requests: List[BeamRequest]) -> BeamDecodeMetadata:
        page = self.cfg.page_size
        lens = [n for r in requests for n in r.beam_lens]
        pages = [p for r in requests for beam in r.beam_pages for p in beam]
        counts = np.array([len(b) for r in requests for b in r.beam_pages], dtype=np.int32)
        indptr_np = np.zeros(len(lens) + 1, dtype=np.int32)
        np.cumsum(counts, out=indptr_np[1:])
        last_np = (np.asarray(lens, dtype=np.int32) - 1) % page + 1
        widest = self.table.max_width
        slots = [r.slot for r in requests]
        scores = self.table.scores[slots, :widest].reshape(-1)
        logger.debug("beam scores this step: %s", scores)  # ok: FC101
        self.backend.cum_logprobs = torch.cat([self.backend.cum_logprobs[: len(lens)], scores])  # expect: FC107
        self._plan_info = (len(lens), int(indptr_np[-1]))
        indptr_host = torch.from_numpy(indptr_np)
        key = self.cfg.bucket_for(len(requests), widest)
        return BeamDecodeMetadata(
            batch=len(requests),
            beam=widest,
            rows=len(lens),
            kv_indptr=indptr_host.to(self.device, non_blocking=True),
            kv_indptr_host=indptr_host,
            kv_indices=torch.tensor(pages, dtype=torch.int32).to(self.device, non_blocking=True),
            kv_last_page_len_host=torch.from_numpy(last_np),
            beam_scores=scores,
            parent_rows=self.table.parent_ids[slots, :widest].reshape(-1),
            wide=widest >= self.cfg.max_beam,
            graph_key=key,
        )
