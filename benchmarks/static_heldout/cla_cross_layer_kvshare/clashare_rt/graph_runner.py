"""Decode CUDA graphs, one per batch bucket."""
from __future__ import annotations

import bisect
from typing import TYPE_CHECKING, Dict

import torch

from clashare_rt.forward_batch import ForwardBatch

if TYPE_CHECKING:
    from clashare_rt.model_runner import ModelRunner


class CudaGraphRunner:
    def __init__(self, model_runner: "ModelRunner") -> None:
        self.model_runner = model_runner
        self.backend = model_runner.backend
        self.cfg = model_runner.cfg
        self.device = model_runner.device
        self.buckets = sorted(self.cfg.graph_buckets)
        max_bs = self.buckets[-1]
        self.static_input_ids = torch.zeros(max_bs, dtype=torch.int64, device=self.device)
        self.static_positions = torch.zeros(max_bs, dtype=torch.int64, device=self.device)
        self.static_seq_lens = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        self.static_out_loc = torch.zeros(max_bs, dtype=torch.int64, device=self.device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.max_context = self.cfg.max_context
        self.mem_pool = None

    def can_run(self, fb: ForwardBatch) -> bool:
        return fb.is_decode and fb.batch_size <= self.buckets[-1] and not fb.use_trtllm

    def _bucket_for(self, n: int) -> int:
        return self.buckets[bisect.bisect_left(self.buckets, n)]

    def capture(self) -> None:
        self.backend.init_cuda_graph_state()
        self.mem_pool = torch.cuda.graph_pool_handle()
        for bs in reversed(self.buckets):
            self.capture_one_batch_size(bs)
        torch.cuda.synchronize()  # ok: FC101

    def capture_one_batch_size(self, bs: int) -> None:
        for w in self.backend.graph_wrappers[bs]:
            if not w._use_cuda_graph:  # expect: FC103
                raise RuntimeError(f"decode wrapper of bucket {bs} is not in graph mode")
        fb = ForwardBatch.dummy_decode(
            bs,
            self.static_input_ids[:bs],
            self.static_positions[:bs],
            self.static_seq_lens[:bs],
            self.static_out_loc[:bs],
        )
        longest = self.static_seq_lens[:bs].max().item()  # expect: FC101
        if longest > self.max_context:
            raise RuntimeError("static sequence lengths were not reset before capture")
        self.backend.init_forward_metadata_capture_cuda_graph(bs, fb)
        model = self.model_runner.model
        for _ in range(2):
            model.decode_tokens(self.static_input_ids[:bs], fb)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mem_pool):
            out = model.decode_tokens(self.static_input_ids[:bs], fb)
        self.graphs[bs] = graph
        self.outputs[bs] = out
        self.backend.graph_bs = None

    def replay(self, fb: ForwardBatch) -> torch.Tensor:
        n = fb.batch_size
        bs = self._bucket_for(n)
        if (fb.seq_lens > self.max_context).any():  # expect: FC101
            raise RuntimeError("a sequence ran past its page table; evict before replay")
        self.static_input_ids[:n].copy_(fb.input_ids)
        self.static_positions[:n].copy_(fb.positions)
        self.static_seq_lens[:n].copy_(fb.seq_lens)
        self.static_out_loc[:n].copy_(fb.out_cache_loc)
        self.backend.init_forward_metadata_replay_cuda_graph(bs, fb)
        # padded rows of the bucket: make them empty ranges
        for g in range(self.backend.num_groups):
            self.backend.graph_kv_indptr[g, n + 1 : bs + 1] = self.backend.graph_kv_indptr[g, n]  # expect: FC104
        self.graphs[bs].replay()
        return self.outputs[bs][:n]
