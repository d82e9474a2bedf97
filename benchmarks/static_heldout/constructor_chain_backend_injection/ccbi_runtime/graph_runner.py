"""Decode graphs per batch-size bucket; the runner reaches the model and the backend through its model runner."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, Optional

import torch

from ccbi.forward_batch import ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from ccbi_runtime.worker import ModelRunner

logger = logging.getLogger(__name__)


@dataclass
class GraphEntry:
    graph: torch.cuda.CUDAGraph
    out: torch.Tensor


class CUDAGraphRunner:
    def __init__(self, model_runner: "ModelRunner"):
        self.cfg, self.device = model_runner.cfg, model_runner.device
        self.model = model_runner.model
        self.attn = model_runner.attn_backend
        self.batch_sizes = [b for b in self.cfg.graph_batch_sizes if b <= self.cfg.max_batch_size]
        self.max_bs = self.batch_sizes[-1]
        self.graphs: Dict[int, GraphEntry] = {}
        self.pool = None
        self.stream = torch.cuda.Stream()
        with torch.device(self.device):
            self.input_ids = torch.zeros(self.max_bs, dtype=torch.int64)
            self.positions = torch.zeros(self.max_bs, dtype=torch.int64)
            self.seq_lens = torch.ones(self.max_bs, dtype=torch.int32)
            self.req_pool_indices = torch.zeros(self.max_bs, dtype=torch.int32)
            self.out_cache_loc = torch.zeros(self.max_bs, dtype=torch.int64)
        self.seq_lens_cpu = torch.ones(self.max_bs, dtype=torch.int32)
        self.logits_out: Optional[torch.Tensor] = None
        self.attn.init_cuda_graph_state(self.max_bs)

    def can_run(self, bs: int) -> bool:
        assert self.graphs, "capture_all() has not run"  # ok: FC109
        return bs <= self.max_bs

    def capture_all(self) -> None:
        for bs, w in self.attn.graph_wrappers.items():
            if vars(w).get("_fixed_batch_size", bs) != bs:  # expect: FC103
                raise RuntimeError(f"graph wrapper of bucket {bs} was built for another batch size")
        self.logits_out = torch.empty(self.max_bs, self.cfg.vocab_size, dtype=torch.bfloat16, device=self.device)  # ok: FC107
        torch.cuda.synchronize()  # ok: FC101
        for bs in reversed(self.batch_sizes):
            self.capture_one_batch_size(bs)
        self.stream.synchronize()  # ok: FC101

    def capture_one_batch_size(self, bs: int) -> None:
        self.attn.init_forward_metadata_capture_cuda_graph(bs, self.seq_lens_cpu[:bs], self.req_pool_indices[:bs])
        fb = ForwardBatch(ForwardMode.DECODE, bs, self.input_ids[:bs], self.positions[:bs], self.seq_lens[:bs],
                          self.seq_lens_cpu[:bs], self.req_pool_indices[:bs], self.out_cache_loc[:bs], graph_bs=bs)
        logger.info("capturing decode graph bs=%d (%d kv tokens)", bs, int(self.seq_lens[:bs].sum()))  # expect: FC101
        g = torch.cuda.CUDAGraph()
        with torch.cuda.stream(self.stream):
            self.model.forward_decode(fb.input_ids, fb.positions, fb)
        with torch.cuda.graph(g, pool=self.pool, stream=self.stream):
            self.logits_out[:bs].copy_(self.model.forward_decode(fb.input_ids, fb.positions, fb))
        self.pool = g.pool()
        self.graphs[bs] = GraphEntry(g, self.logits_out[:bs])

    def replay(self, fb: ForwardBatch) -> torch.Tensor:
        raw_bs = fb.batch_size
        bs = min(b for b in self.batch_sizes if b >= raw_bs)  # ok: FC101
        self.input_ids[:raw_bs].copy_(fb.input_ids)  # ok: FC104
        self.positions[:raw_bs].copy_(fb.positions)  # ok: FC101
        self.seq_lens[:raw_bs].copy_(fb.seq_lens)
        self.req_pool_indices[:raw_bs].copy_(fb.req_pool_indices)
        self.seq_lens_cpu[:raw_bs].copy_(fb.seq_lens_cpu)
        self.seq_lens_cpu[raw_bs:bs].fill_(1)
        self.attn.init_forward_metadata_replay_cuda_graph(bs, self.seq_lens_cpu, self.req_pool_indices)
        self.out_cache_loc[:raw_bs].copy_(fb.out_cache_loc)
        self.out_cache_loc[raw_bs:bs].fill_(0)  # ok: FC104
        bufs = self.attn.graph_bufs
        if bufs:
            bufs["last_page_len"][raw_bs:bs].fill_(1)  # expect: FC104
        logger.debug(f"replay bs={raw_bs}->{bs} seq_lens={fb.seq_lens}")  # expect: FC101
        entry = self.graphs[bs]
        entry.graph.replay()
        out = entry.out
        entry.out = torch.empty_like(out)  # expect: FC107
        return out[:raw_bs]
