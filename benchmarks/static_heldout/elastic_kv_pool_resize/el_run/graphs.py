"""Decode graphs per bucket; they bake the pool's cache pointer in."""

from __future__ import annotations

from typing import Dict, List, Optional

import torch

from el_attn.backend import ElasticAttnBackend
from el_run.model import ElasticLM
from elastic.batch import ForwardBatch
from elastic.config import ElasticConfig
from elastic.pool import ElasticKVPool


class ElasticGraphRunner:
    def __init__(self, cfg: ElasticConfig, model: ElasticLM, backend: ElasticAttnBackend,
                 pool: ElasticKVPool, device: torch.device):
        self.cfg = cfg
        self.model = model
        self.backend = backend
        self.pool = pool
        self.device = device
        self.static_ids = torch.zeros(cfg.max_batch, dtype=torch.long, device=device)
        self.static_pos = torch.zeros(cfg.max_batch, dtype=torch.long, device=device)
        self.static_logits = torch.zeros(cfg.max_batch, cfg.vocab_size, dtype=torch.bfloat16, device=device)
        self.pad_ids: Optional[torch.Tensor] = None
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.captured_live: Dict[int, int] = {}
        self.capture_stream = torch.cuda.Stream(device)
        self.high_watermark = int(cfg.grow_watermark * cfg.initial_pages)
        self.bound_generation = pool.generation

    def bucket_for(self, bs: int) -> Optional[int]:
        return next((b for b in self.cfg.buckets if b >= bs), None)

    def captured_sizes(self) -> List[int]:
        return sorted(self.graphs, reverse=True)

    def capture_one_batch_size(self, bs: int) -> None:
        if bs not in self.backend.decode_wrappers:
            self.backend.decode_wrappers[bs] = self.backend.make_graph_wrapper(bs)
        self.backend.init_forward_metadata_capture_cuda_graph(bs)
        self.capture_stream.wait_stream(torch.cuda.current_stream(self.device))
        self.capture_stream.synchronize()  # ok: FC101
        # how full the pool was when this bucket was captured, for the resize heuristics
        self.captured_live[bs] = self.pool.live_pages().item()  # expect: FC101
        ids, pos = self.static_ids[:bs], self.static_pos[:bs]
        self.model.decode(ids, pos, self.pool.kv_cache, bs)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=self.capture_stream):
            out = self.model.decode(ids, pos, self.pool.kv_cache, bs)
            self.static_logits[:bs].copy_(out)
        self.graphs[bs] = g
        self.bound_generation = self.pool.generation

    def replay(self, bs: int, batch: ForwardBatch) -> torch.Tensor:
        if self.bound_generation != self.pool.generation:
            raise RuntimeError(
                f"graphs bound to pool generation {self.bound_generation}, pool at {self.pool.generation_dev}"  # ok: FC101
            )
        live = self.pool.page_counts["live"]
        if live > self.high_watermark:  # expect: FC101
            self.pool.request_grow = True
        if self.pad_ids is None:
            self.pad_ids = torch.zeros(self.cfg.max_batch, dtype=torch.long, device=self.device)  # ok: FC107
        real = batch.batch_size
        self.static_ids[:real].copy_(batch.input_ids)
        self.static_ids[real:bs].copy_(self.pad_ids[: bs - real])
        self.static_pos[:real].copy_(batch.positions)
        self.backend.init_forward_metadata_replay_cuda_graph(bs, batch)
        self.graphs[bs].replay()
        self.static_logits.resize_(bs, self.cfg.vocab_size)  # expect: FC107
        return self.static_logits[:real]
