"""Captures one CUDA graph per batch-size bucket and replays the smallest that fits."""

from typing import Dict

import torch

from .backend import FlashInferBackend
from .config import EngineConfig
from .metadata import ForwardBatch
from .model import AGModel


class GraphRunner:
    def __init__(self, cfg: EngineConfig, model: AGModel, backend: FlashInferBackend):
        self.cfg = cfg
        self.model = model
        self.backend = backend
        self.max_bs = max(cfg.graph_buckets)
        dev = torch.device(cfg.device)
        self.static_input_ids = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.static_positions = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.static_out_cache_loc = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.static_seq_lens = torch.ones(self.max_bs, dtype=torch.int32, device=dev)
        self.static_req_pool_indices = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.pool = None

    def can_run(self, bs: int) -> bool:
        return bool(self.graphs) and bs <= self.max_bs

    def _static_batch(self, bs: int) -> ForwardBatch:
        return ForwardBatch(
            batch_size=bs,
            is_decode=True,
            input_ids=self.static_input_ids[:bs],
            positions=self.static_positions[:bs],
            out_cache_loc=self.static_out_cache_loc[:bs],
            seq_lens=self.static_seq_lens[:bs],
            seq_lens_cpu=torch.ones(bs, dtype=torch.int32),
            req_pool_indices=self.static_req_pool_indices[:bs],
        )

    def capture_all(self) -> None:
        assert not self.graphs, "capture_all() runs once"  # ok: FC109
        for bs in sorted(self.cfg.graph_buckets, reverse=True):
            self.capture_one_batch_size(bs)

    def capture_one_batch_size(self, bs: int) -> None:
        fb = self._static_batch(bs)
        self.backend.init_forward_metadata_capture_cuda_graph(bs, fb.seq_lens, fb.req_pool_indices)
        fb.attn = self.backend.forward_metadata
        for _ in range(2):  # warm up the autotuners outside the graph
            self.model.forward_decode(fb)
        torch.cuda.synchronize()  # ok: FC101
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            out = self.model.forward_decode(fb)
        self.pool = g.pool()
        self.graphs[bs] = g
        self.outputs[bs] = out

    def replay(self, batch: ForwardBatch) -> torch.Tensor:
        assert batch.batch_size <= self.max_bs, "batch larger than the largest captured graph"  # expect: FC109
        raw = batch.batch_size
        bs = next(b for b in sorted(self.graphs) if b >= raw)
        self.static_input_ids[:raw].copy_(batch.input_ids)
        if raw == bs:
            self.static_positions = batch.positions.clone()  # expect: FC107
        else:
            self.static_positions[:raw].copy_(batch.positions)  # ok: FC107
        self.static_out_cache_loc[:raw].copy_(batch.out_cache_loc)
        self.static_seq_lens[:raw].copy_(batch.seq_lens)
        self.static_seq_lens[raw:bs].fill_(1)
        self.static_req_pool_indices[:raw].copy_(batch.req_pool_indices)
        self.backend.init_forward_metadata_replay_cuda_graph(
            bs, raw, batch.seq_lens_cpu, self.static_seq_lens[:bs], self.static_req_pool_indices[:bs]
        )
        # padded rows: an empty page range each
        self.backend.kv_indptr[raw + 1 : bs + 1].copy_(self.backend.kv_indptr_host[raw + 1 : bs + 1], non_blocking=True)  # expect: FC104
        self.graphs[bs].replay()
        return self.outputs[bs][:raw]
