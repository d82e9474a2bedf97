from __future__ import annotations

import logging
from collections import Counter
from typing import Dict, List, Tuple

import numpy as np
import torch

from knnserve.attn import KnnAttnBackend
from knnserve.batch import DecodeRequestBatch
from knnserve.datastore.ivf_index import IVFFlatIndex
from knnserve.interpolate import KnnInterpolator
from knnserve.model import KnnLM

logger = logging.getLogger(__name__)


class KnnModelRunner:
    def __init__(self, settings, model: KnnLM, attn: KnnAttnBackend, index: IVFFlatIndex,
                 interp: KnnInterpolator, device: torch.device):
        self.settings = settings
        self.model = model
        self.attn = attn
        self.index = index
        self.interp = interp
        self.device = device
        n = max(settings.buckets)
        self.static_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.static_pos = torch.zeros(n, dtype=torch.int64, device=device)
        self.static_query: Dict[int, torch.Tensor] = {}
        self.static_logits: Dict[int, torch.Tensor] = {}
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.tokens_pinned = torch.zeros(settings.max_batch, dtype=torch.int64, pin_memory=True)
        self.done_event = torch.cuda.Event()
        self.stats = Counter()
        self.recorded_max_len = 0

    def describe(self) -> str:
        return f"knn-lm lambda={self.interp.lmbda} mixer={self.interp._backend}"  # ok: FC103

    # ------------------------------------------------------------------ capture
    def _dummy_batch(self, bs: int) -> DecodeRequestBatch:
        pages = [np.zeros(1, dtype=np.int32) for _ in range(bs)]
        return DecodeRequestBatch(list(range(bs)), pages, np.ones(bs, dtype=np.int32),
                                  self.static_ids[:bs], self.static_pos[:bs])

    def record_graphs(self) -> None:
        pool = None
        for bs in reversed(self.attn.buckets):
            meta = self.attn.build_metadata(self._dummy_batch(bs))
            self.attn.refresh_graph_inputs(meta)
            self.attn.plan_key_head(meta)
            torch.cuda.synchronize()  # ok: FC101
            self.recorded_max_len = max(self.recorded_max_len, self.attn.seq_lens[:bs].max().item())  # expect: FC101
            self.model.decode(self.static_ids[:bs], self.static_pos[:bs])
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                self.static_query[bs], self.static_logits[bs] = self.model.decode(self.static_ids[:bs], self.static_pos[:bs])
            pool = g.pool()
            self.graphs[bs] = g

    # ------------------------------------------------------------------ per step
    def prefill(self, batch: DecodeRequestBatch) -> None:
        meta = self.attn.build_prefill_metadata(batch.new_prompts, batch.page_lists[: len(batch.new_prompts)],
                                                batch.last_page_lens[: len(batch.new_prompts)])
        self.attn.plan_prefill(meta)

    def step(self, batch: DecodeRequestBatch) -> Tuple[torch.Tensor, torch.cuda.Event]:
        if batch.new_prompts:
            self.prefill(batch)
        meta = self.attn.build_metadata(batch)
        bs = meta.bs
        self.stats["pages"] += int(meta.kv_indptr_cpu[bs])  # ok: FC101
        if meta.bucket in self.graphs:
            self.attn.overflow = None
            self.attn.refresh_graph_inputs(meta)
            self.attn.plan_key_head(meta)
            self.static_ids[:bs].copy_(batch.input_ids)
            self.static_pos[:bs].copy_(batch.positions)
            self.graphs[meta.bucket].replay()
            query, logits = self.static_query[meta.bucket][:bs], self.static_logits[meta.bucket][:bs]
        else:
            self.attn.overflow = meta
            self.attn.plan_key_head(meta)
            query, logits = self.model.decode(batch.input_ids, batch.positions)
        dists, vals = self.index.search(query, self.settings.knn_k)
        logger.debug("knn nearest distances %s", dists[:, 0])  # ok: FC101
        self.stats["near_hits"] += int((dists[:, 0] < self.settings.near_dist).sum())  # expect: FC101
        probs = self.interp.mix(logits, dists, vals)
        tokens = torch.multinomial(probs, 1).squeeze(-1)
        self.tokens_pinned[:bs].copy_(tokens, non_blocking=True)
        self.done_event.record()
        self.release_finished(batch, meta)
        return self.tokens_pinned[:bs], self.done_event

    def release_finished(self, batch: DecodeRequestBatch, meta) -> None:
        indptr = meta.kv_indptr_cpu.numpy()
        for row in batch.finished_rows:
            # point a finished row at the padding page so its pages can be handed out right away
            self.attn.kv_indices[int(indptr[row]) : int(indptr[row + 1])].fill_(0)  # expect: FC104


def drain_outputs(tokens_pinned: torch.Tensor, event: torch.cuda.Event) -> List[int]:
    """Runs in the detokenizer thread."""
    event.synchronize()
    return tokens_pinned.tolist()
