from __future__ import annotations

import bisect
import logging
from typing import Dict, List, Optional

import numpy as np
import torch

from prmscore.attention import PrmAttnBackend
from prmscore.batch import ScoreBatch
from prmscore.config import ScoreConfig
from prmscore.model import PrmModel

logger = logging.getLogger(__name__)


class ScoreGraphRunner:
    """CUDA graphs for small scoring batches, keyed by padded token count."""

    def __init__(self, cfg: ScoreConfig, model: PrmModel, attn: PrmAttnBackend, kv_caches: List[torch.Tensor],
                 device: torch.device):
        self.cfg = cfg
        self.model = model
        self.attn = attn
        self.kv_caches = kv_caches
        self.device = device
        self.buckets = sorted(cfg.graph_token_buckets)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self._plan_info: Dict[int, int] = {}
        max_t = self.buckets[-1]
        self.input_ids = torch.zeros(max_t, dtype=torch.int64, device=device)
        self.step_positions = torch.zeros(max_t, dtype=torch.int64, device=device)
        self.step_counts = torch.zeros(cfg.graph_max_cands, dtype=torch.int32, device=device)
        self.seq_lens = torch.zeros(cfg.graph_max_cands, dtype=torch.int32, device=device)
        self.step_positions_cpu = torch.zeros(max_t, dtype=torch.int64, pin_memory=True)

    def capture(self) -> None:
        for t in reversed(self.buckets):
            self.attn.init_graph_wrapper(t)
            self.capture_one_batch_size(t)

    def capture_one_batch_size(self, num_tokens: int) -> None:
        c = self.cfg.graph_max_cands
        per = num_tokens // c
        qo = torch.arange(0, (c + 1) * per, per, dtype=torch.int32)[: c + 1]
        kv = torch.arange(c + 1, dtype=torch.int32)
        last = torch.full((c,), min(per, self.cfg.page_size), dtype=torch.int32)
        self.seq_lens[:c].fill_(per)
        max_len = int(self.seq_lens[:c].max())  # expect: FC101
        if max_len > self.cfg.page_size:
            logger.info("bucket %d: %d tokens per dummy candidate", num_tokens, max_len)
        self.attn.init_forward_metadata_capture_cuda_graph(num_tokens, c, qo, kv, last)
        torch.cuda.synchronize()  # ok: FC101
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = self.model(self.input_ids[:num_tokens], self.kv_caches, self.step_positions[:num_tokens],
                             self.step_counts, c)
        self.graphs[num_tokens] = g
        self.outputs[num_tokens] = out
        self._plan_info[num_tokens] = c  # ok: FC103

    def bucket_for(self, batch: ScoreBatch) -> Optional[int]:
        if batch.num_cands > self.cfg.graph_max_cands:
            return None
        i = bisect.bisect_left(self.buckets, batch.num_tokens)
        return self.buckets[i] if i < len(self.buckets) else None

    def replay(self, batch: ScoreBatch, num_tokens: int) -> torch.Tensor:
        n = batch.num_tokens
        self.input_ids[:n].copy_(batch.input_ids)
        self._fill_step_positions(batch)
        self.step_counts[: batch.num_cands].copy_(batch.step_counts)
        self.attn.init_forward_metadata_replay_cuda_graph(num_tokens, batch)
        self.graphs[num_tokens].replay()
        steps = int(batch.step_seg_indptr_cpu[-1])  # ok: FC101
        return self.outputs[num_tokens][:steps]

    def _fill_step_positions(self, batch: ScoreBatch) -> None:
        pos = torch.nonzero(batch.input_ids == self.cfg.step_tag_id).squeeze(1)  # expect: FC101
        self.step_positions[: pos.numel()].copy_(pos)
