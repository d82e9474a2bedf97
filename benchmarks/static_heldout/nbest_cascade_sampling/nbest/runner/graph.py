"""CUDA graphs of the unique-suffix decode (model + sampler), one per bucket of live completions."""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch

from nbest.cascade import CascadeBackend, CascadeBatch
from nbest.config import NBestConfig
from nbest.model import NBestModel
from nbest.sampler import FlashInferSampler


class SuffixGraphRunner:
    def __init__(
        self, model: NBestModel, backend: CascadeBackend, sampler: FlashInferSampler, cfg: NBestConfig, device
    ) -> None:
        self.model = model
        self.backend = backend
        self.sampler = sampler
        self.cfg = cfg
        self.device = device
        max_bs = cfg.graph_bs[-1]
        self.input_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.out_cache_loc = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.out_ids = torch.zeros(max_bs, dtype=torch.int32, device=device)
        self.out_logprobs = torch.zeros(max_bs, dtype=torch.float32, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.pool = None
        self.kv_caches: List[torch.Tensor] = []

    def bucket(self, n: int) -> Optional[int]:
        return next((bs for bs in self.cfg.graph_bs if bs >= n and bs in self.graphs), None)

    def _step(self, bs: int) -> None:
        logits = self.model.forward_graph(self.input_ids[:bs], self.out_cache_loc[:bs], self.kv_caches)
        ids, logprobs = self.sampler.sample(logits, bs)
        self.out_ids[:bs].copy_(ids)
        self.out_logprobs[:bs].copy_(logprobs)

    def record(self, kv_caches: List[torch.Tensor]) -> None:
        self.kv_caches = kv_caches
        torch.cuda.synchronize()  # ok: FC101
        for bs in reversed(self.cfg.graph_bs):
            self.backend.bind_suffix_wrapper(bs)
            self._step(bs)  # warm-up: JIT the kernels outside the graph
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                self._step(bs)
            self.pool = graph.pool()
            self.graphs[bs] = graph

    def replay(self, batch: CascadeBatch, bs: int) -> Tuple[torch.Tensor, torch.Tensor]:
        raw = batch.num_seqs
        if self.out_ids.shape[0] < bs:  # a bucket recorded after start-up outgrew the output buffer
            self.out_ids = torch.empty(bs, dtype=torch.int32, device=self.device)  # expect: FC107
        self.input_ids[:raw].copy_(batch.input_ids, non_blocking=True)
        self.out_cache_loc[:raw].copy_(batch.out_cache_loc, non_blocking=True)
        self.out_cache_loc[raw:bs].zero_()
        self.backend.load_suffix_graph(batch, bs)
        self.graphs[bs].replay()
        return self.out_ids[:raw], self.out_logprobs[:raw]
