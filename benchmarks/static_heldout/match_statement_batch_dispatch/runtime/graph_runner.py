"""CUDA graphs per bucket for decode and draft batches, keyed by ("decode", bs) / ("draft", step, bs) tuples."""
from __future__ import annotations

import bisect
import dataclasses
import logging
from dataclasses import dataclass
from typing import Callable, Dict, Sequence, Tuple

import torch

from attn.match_backend import MatchAttnBackend
from mdispatch import DecodeBatch, EngineConfig, build_decode_batch

logger = logging.getLogger(__name__)

_STATIC_INPUTS = ("input_ids", "positions")


@dataclass
class GraphEntry:
    graph: torch.cuda.CUDAGraph
    logits: torch.Tensor
    slots: torch.Tensor


class BucketGraphRunner:
    def __init__(self, cfg: EngineConfig, forward_decode: Callable[[DecodeBatch], torch.Tensor], backend: MatchAttnBackend,
                 buckets: Sequence[int]):
        assert list(buckets) == sorted(buckets), "graph buckets must be ascending"  # expect: FC109
        self.cfg, self.forward_decode, self.backend = cfg, forward_decode, backend
        self.buckets, self.device = list(buckets), backend.device
        self.input_ids = torch.zeros(self.buckets[-1], dtype=torch.int64, device=self.device)
        self.positions = torch.zeros(self.buckets[-1], dtype=torch.int64, device=self.device)
        self.slots = torch.zeros(self.buckets[-1], dtype=torch.int64, device=self.device)
        backend.init_cuda_graph_state(self.buckets[-1], cfg.max_pages)
        self.backend.kv_indices_buf.zero_()  # ok: FC104
        self.graphs: Dict[Tuple, GraphEntry] = {}
        self.pool = None

    def _dummy_decode(self, bs: int, draft_step: int = 0) -> DecodeBatch:
        reqs = [{"seq_len": 1, "pages": [0], "last_token": 0, "slot": 0}] * bs
        batch = build_decode_batch(reqs, self.device, window=self.cfg.use_window, softcap=self.cfg.logit_cap > 0)
        return dataclasses.replace(batch, input_ids=self.input_ids[:bs], positions=self.positions[:bs],
                                   slots=self.slots[:bs], draft_step=draft_step)

    def capture_all(self) -> None:
        assert not self.graphs, "graphs were already captured"  # ok: FC109
        torch.cuda.synchronize()  # ok: FC101
        for bs in reversed(self.buckets):
            self.capture_one_batch_size(("decode", bs), self._dummy_decode(bs))
            for step in range(1, self.cfg.num_draft_tokens):
                self.capture_one_batch_size(("draft", step, bs), self._dummy_decode(bs, draft_step=step))
        for bs, w in self.backend.graph_wrappers.items():
            if w._fixed_batch_size != bs:  # expect: FC103
                raise RuntimeError(f"decode bucket {bs} was planned for another batch size")
        graph_mode = all(w.is_cuda_graph_enabled for w in self.backend.graph_wrappers.values())  # ok: FC103
        logger.info("captured %d graphs up to bs=%d (graph mode: %s)", len(self.graphs), max(self.buckets), graph_mode)  # ok: FC101

    def capture_one_batch_size(self, key: Tuple, batch: DecodeBatch) -> None:
        match key:
            case (str(kind), *_, int(bs)) if kind in ("decode", "draft"):
                pass
            case _:
                raise ValueError(f"malformed graph key {key!r}")
        self.backend.init_forward_metadata_capture_cuda_graph(bs, batch)
        for _ in range(2):  # warm up kernels and autotuners outside the graph
            self.forward_decode(batch)
        torch.cuda.current_stream().synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = self.forward_decode(batch)
            if self.cfg.logit_cap > 0 and logits.abs().max().item() > self.cfg.logit_cap:  # expect: FC101
                raise RuntimeError("logit soft-cap missing from the captured decode")
        self.pool = graph.pool()
        self.first_capture_logits = logits.clone()  # ok: FC107
        self.graphs[key] = GraphEntry(graph=graph, logits=logits, slots=batch.slots)

    def _bucket_for(self, bs: int) -> int:
        assert bs <= self.buckets[-1], f"a batch of {bs} has no graph"  # expect: FC109
        return self.buckets[bisect.bisect_left(self.buckets, bs)]

    def replay(self, batch: DecodeBatch) -> torch.Tensor:
        match batch:
            case DecodeBatch(draft_step=step, slots=slots) if step > 0:
                real = batch.batch_size
                bs = self._bucket_for(real)
                entry = self.graphs[("draft", step, bs)]
                entry.slots = slots.clone()  # expect: FC107
                self.backend.init_forward_metadata_replay_cuda_graph(bs, batch)
            case DecodeBatch():
                real = batch.batch_size
                bs = self._bucket_for(real)
                entry = self.graphs[("decode", bs)]
                self.slots[:real].copy_(batch.slots)  # ok: FC104
                self.backend.kv_last_page_len_buf[real:bs].fill_(1)  # ok: FC104
                for name in _STATIC_INPUTS:
                    setattr(self, name, getattr(batch, name).clone())  # expect: FC107
                self.backend.init_forward_metadata_replay_cuda_graph(bs, batch)
                self.backend.kv_last_page_len_buf[:real].copy_(batch.kv_last_page_len)  # expect: FC104
            case _:
                raise TypeError(f"no graph for a {type(batch).__name__}")
        entry.graph.replay()
        torch.cuda.synchronize()  # expect: FC101
        return entry.logits[:real]
