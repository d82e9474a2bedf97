"""Decode CUDA graphs, one per padded batch size."""
from __future__ import annotations

import bisect
import logging
from typing import TYPE_CHECKING, Dict, List, Optional

import torch

from hisrt.attention.flashinfer_backend import FlashInferAttnBackend

from .model_runner import ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from .model_runner import ModelRunner

logger = logging.getLogger(__name__)


class CudaGraphRunner:
    def __init__(self, model_runner: "ModelRunner") -> None:
        self.model_runner = model_runner
        self.attn_backend: FlashInferAttnBackend = model_runner.attn_backend
        self.model = model_runner.model
        self.device = model_runner.device
        self.capture_bs: List[int] = sorted(model_runner.server_args.cuda_graph_bs)
        self.max_bs = self.capture_bs[-1]
        self.max_context_len = model_runner.max_context_len
        self.seq_len_fill_value = 1
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.output_buffers: Dict[int, torch.Tensor] = {}
        self.graph_pool = None

        self.input_ids = torch.zeros(self.max_bs, dtype=torch.int64, device=self.device)
        self.positions = torch.zeros(self.max_bs, dtype=torch.int64, device=self.device)
        self.req_pool_indices = torch.zeros(self.max_bs, dtype=torch.int64, device=self.device)
        self.seq_lens = torch.full((self.max_bs,), self.seq_len_fill_value, dtype=torch.int64, device=self.device)
        self.out_cache_loc = torch.zeros(self.max_bs, dtype=torch.int64, device=self.device)
        self.seq_lens_cpu = torch.full((self.max_bs,), self.seq_len_fill_value, dtype=torch.int64)
        self.last_seq_lens_cpu: Optional[torch.Tensor] = None

        self.attn_backend.init_cuda_graph_state(self.max_bs)
        # padded rows of a replay read the pool's padding slot 0
        self.attn_backend.cuda_graph_kv_indices.zero_()  # ok: FC104
        self.capture()

    def can_run(self, fb: ForwardBatch) -> bool:
        return fb.batch_size <= self.max_bs

    # ------------------------------------------------------------------ capture

    def capture(self) -> None:
        for bs in reversed(self.capture_bs):
            graph, out = self.capture_one_batch_size(bs)
            self.graphs[bs] = graph
            self.output_buffers[bs] = out

    def capture_one_batch_size(self, bs: int):
        input_ids = self.input_ids[:bs]
        positions = self.positions[:bs]
        req_pool_indices = self.req_pool_indices[:bs]
        seq_lens = self.seq_lens[:bs]
        self.attn_backend.init_forward_metadata_capture_cuda_graph(bs, req_pool_indices, seq_lens, self.seq_lens_cpu)
        fb = ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=bs,
            input_ids=input_ids,
            positions=positions,
            req_pool_indices=req_pool_indices,
            seq_lens=seq_lens,
            seq_lens_cpu=self.seq_lens_cpu[:bs],
            seq_lens_sum=bs * self.seq_len_fill_value,
            out_cache_loc=self.out_cache_loc[:bs],
        )

        def run_once() -> torch.Tensor:
            return self.model.run_decode(input_ids, positions, fb)

        for _ in range(2):
            torch.cuda.synchronize()  # ok: FC101
            run_once()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.graph_pool):
            out = run_once()
        self.graph_pool = graph.pool()
        return graph, out

    # ------------------------------------------------------------------ replay

    def replay_prepare(self, fb: ForwardBatch) -> None:
        raw_bs = fb.batch_size
        bs = self.capture_bs[bisect.bisect_left(self.capture_bs, raw_bs)]
        if int(fb.seq_lens_cpu.max()) > self.max_context_len:  # ok: FC101
            raise RuntimeError(f"a request exceeds the captured context length {self.max_context_len}")
        if bs != raw_bs:
            self.seq_lens.fill_(self.seq_len_fill_value)
            self.out_cache_loc.zero_()
        self.input_ids[:raw_bs].copy_(fb.input_ids)
        self.positions[:raw_bs].copy_(fb.positions)
        self.req_pool_indices[:raw_bs].copy_(fb.req_pool_indices)
        self.seq_lens[:raw_bs].copy_(fb.seq_lens)
        num_loc = fb.out_cache_loc.numel()
        if num_loc > self.out_cache_loc.numel():
            # a decode batch that also appends the loaded-back tail carries more than one slot per request
            self.out_cache_loc = torch.zeros(num_loc, dtype=torch.int64, device=self.device)  # expect: FC107
        self.out_cache_loc[:num_loc].copy_(fb.out_cache_loc)
        self.seq_lens_cpu.fill_(self.seq_len_fill_value)
        self.seq_lens_cpu[:raw_bs].copy_(fb.seq_lens_cpu)
        # the scheduler compares the next batch's lengths against these to reuse the plan
        self.last_seq_lens_cpu = fb.seq_lens_cpu.clone()  # ok: FC107
        seq_lens_sum = fb.seq_lens.sum().item() + (bs - raw_bs) * self.seq_len_fill_value  # expect: FC101
        self.attn_backend.init_forward_metadata_replay_cuda_graph(
            bs, raw_bs, self.req_pool_indices, self.seq_lens, seq_lens_sum, self.seq_lens_cpu[:bs]
        )
        self.raw_bs = raw_bs
        self.bs = bs

    def replay(self, fb: ForwardBatch) -> torch.Tensor:
        self.replay_prepare(fb)
        self.graphs[self.bs].replay()
        return self.output_buffers[self.bs][: self.raw_bs]
