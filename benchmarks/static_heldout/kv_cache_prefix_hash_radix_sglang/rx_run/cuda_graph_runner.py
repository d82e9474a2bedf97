"""SGLang-shaped CUDA graph runner for decode."""
from __future__ import annotations

from typing import TYPE_CHECKING, Dict, Optional

import torch

from radix import ForwardBatch

if TYPE_CHECKING:
    from rx_run.scheduler import ModelRunner


class CudaGraphRunner:
    def __init__(self, model_runner: "ModelRunner"):
        self.model_runner = model_runner
        self.attn_backend = model_runner.attn_backend
        self.capture_bs = [1, 2, 4, 8, 16, 24, 32]
        self.max_bs = self.capture_bs[-1]
        self.attn_backend.init_cuda_graph_state(self.max_bs, model_runner.max_context_len)
        with torch.device(model_runner.device):
            self.input_ids = torch.zeros(self.max_bs, dtype=torch.int64)
            self.positions = torch.zeros(self.max_bs, dtype=torch.int64)
            self.req_pool_indices = torch.zeros(self.max_bs, dtype=torch.int32)
            self.seq_lens = torch.ones(self.max_bs, dtype=torch.int32)
            self.out_cache_loc = torch.zeros(self.max_bs, dtype=torch.int64)
        self.seq_lens_mirror = torch.ones(self.max_bs, dtype=torch.int32)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.pool: Optional[tuple] = None

    def _bucket(self, raw_bs: int) -> int:
        return next(b for b in self.capture_bs if b >= raw_bs)

    def can_run(self, fb: ForwardBatch) -> bool:
        if fb.forward_mode != "decode" or fb.batch_size > self.max_bs:
            return False
        bs = self._bucket(fb.batch_size)
        w = self.attn_backend.decode_cuda_graph_wrappers.get(bs)
        if w is None:
            return False
        if not w.is_cuda_graph_enabled:  # ok: FC103
            return False
        return w.__dict__.get("_fixed_batch_size", bs) == bs  # expect: FC103

    def capture(self) -> None:
        for bs in reversed(self.capture_bs):
            self.graphs[bs], self.outputs[bs] = self.capture_one_batch_size(bs)
        torch.cuda.synchronize()  # ok: FC101

    def capture_one_batch_size(self, bs: int):
        fb = ForwardBatch(
            "decode", bs, self.input_ids[:bs], self.positions[:bs], self.req_pool_indices[:bs], self.seq_lens[:bs],
            self.seq_lens_mirror[:bs], self.out_cache_loc[:bs], self.attn_backend,
        )
        self.attn_backend.init_forward_metadata_capture_cuda_graph(bs, self.seq_lens_mirror[:bs])
        model = self.model_runner.model
        kv_caches = self.model_runner.kv_caches

        def run_once() -> torch.Tensor:
            return model.forward_decode(fb.input_ids, kv_caches, fb)

        for _ in range(2):
            run_once()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = run_once()
        self.pool = graph.pool()
        return graph, out

    def replay(self, fb: ForwardBatch) -> torch.Tensor:
        raw_bs = fb.batch_size
        bs = self._bucket(raw_bs)
        if bs != raw_bs:
            self.seq_lens.fill_(1)
            self.seq_lens_mirror.fill_(1)
            self.req_pool_indices.zero_()
        self.input_ids[:raw_bs].copy_(fb.input_ids)
        self.positions[:raw_bs].copy_(fb.positions)
        self.req_pool_indices[:raw_bs].copy_(fb.req_pool_indices)
        self.seq_lens[:raw_bs].copy_(fb.seq_lens)
        self.seq_lens_mirror[:raw_bs].copy_(fb.seq_lens_cpu)
        self.out_cache_loc = fb.out_cache_loc.new_zeros(self.max_bs)  # expect: FC107
        self.out_cache_loc[:raw_bs].copy_(fb.out_cache_loc)
        self.attn_backend.init_forward_metadata_replay_cuda_graph(
            bs, raw_bs, self.req_pool_indices[:bs], self.seq_lens[:bs], self.seq_lens_mirror[:bs]
        )
        self.graphs[bs].replay()
        return self.outputs[bs][:raw_bs]
