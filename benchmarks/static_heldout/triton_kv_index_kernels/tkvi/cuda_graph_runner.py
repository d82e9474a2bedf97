"""Decode CUDA graphs, one per padded batch size (SGLang's ``CudaGraphRunner``).

The static inputs live in this runner; the attention metadata lives in the backend's persistent buffers,
which the graph-mode wrappers are bound to at capture and which the backend refills before every replay.
"""

from __future__ import annotations

import bisect
import logging
from typing import TYPE_CHECKING, Dict

import torch

from tkv_kernels.index_kernels import fill_rows_
from tkvi.forward_batch import ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from tkvi.model_runner import ModelRunner

logger = logging.getLogger(__name__)


class CudaGraphRunner:
    def __init__(self, model_runner: "ModelRunner"):
        self.model_runner = model_runner
        self.attn_backend = model_runner.attn_backend
        self.device = model_runner.device
        args = model_runner.server_args
        self.capture_bs = [1, 2, 4, 8] + list(range(16, args.cuda_graph_max_bs + 1, 16))
        self.max_bs = self.capture_bs[-1]
        self.max_num_token = self.max_bs
        self.seq_len_fill_value = 1
        self.vocab_size = args.vocab_size
        self.attn_backend.init_cuda_graph_state(self.max_bs, self.max_num_token)

        with torch.device(self.device):
            self.input_ids = torch.zeros((self.max_num_token,), dtype=torch.int64)
            self.positions = torch.zeros((self.max_num_token,), dtype=torch.int64)
            self.req_pool_indices = torch.zeros((self.max_bs,), dtype=torch.int64)
            self.seq_lens = torch.full((self.max_bs,), self.seq_len_fill_value, dtype=torch.int32)
            self.out_cache_loc = torch.zeros((self.max_num_token,), dtype=torch.int64)
            # padding rows read request slot 0, whose req_to_token row only holds the padding slot
            self.pad_req_pool_indices = torch.zeros((self.max_bs,), dtype=torch.int64)
        self.seq_lens_cpu = torch.full((self.max_bs,), self.seq_len_fill_value, dtype=torch.int32)
        self.copy_stream = torch.cuda.Stream(device=self.device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.output_buffers: Dict[int, torch.Tensor] = {}
        self.graph_memory_pool = None
        self.raw_bs = 0
        self.bs = 0
        self.capture()

    def can_run(self, forward_batch: ForwardBatch) -> bool:
        return forward_batch.forward_mode.is_decode() and forward_batch.batch_size <= self.max_bs

    def capture(self) -> None:
        # largest first, so the smaller graphs reuse the memory pool of the larger ones
        for bs in reversed(self.capture_bs):
            self.record_bucket(bs)

    def record_bucket(self, bs: int) -> None:
        graph = torch.cuda.CUDAGraph()
        input_ids = self.input_ids[:bs]
        positions = self.positions[:bs]
        req_pool_indices = self.req_pool_indices[:bs]
        seq_lens = self.seq_lens[:bs]
        seq_lens_cpu = self.seq_lens_cpu[:bs]
        self.attn_backend.init_forward_metadata_capture_cuda_graph(
            bs, bs, req_pool_indices, seq_lens, seq_lens_cpu, ForwardMode.DECODE
        )
        forward_batch = ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=bs,
            input_ids=input_ids,
            positions=positions,
            req_pool_indices=req_pool_indices,
            seq_lens=seq_lens,
            seq_lens_cpu=seq_lens_cpu,
            seq_lens_sum=bs * self.seq_len_fill_value,
            out_cache_loc=self.out_cache_loc[:bs],
            attn_backend=self.attn_backend,
        )
        self.output_buffers[bs] = torch.empty((bs, self.vocab_size), dtype=self.model_runner.dtype, device=self.device)  # ok: FC107
        output = self.output_buffers[bs]

        def run_once():
            logits = self.model_runner.model.forward_decode(input_ids, positions, forward_batch)
            output.copy_(logits)

        # warm up with the graph-mode wrappers (JIT compiles, autotunes) before recording
        for _ in range(2):
            torch.cuda.synchronize()  # ok: FC101
            run_once()

        with torch.cuda.graph(graph, pool=self.graph_memory_pool):
            logger.info(f"recording decode graph bs={bs} seq_lens={seq_lens}")  # expect: FC101
            run_once()
        self.graph_memory_pool = graph.pool()
        self.graphs[bs] = graph

    def replay_prepare(self, forward_batch: ForwardBatch) -> None:
        raw_bs = forward_batch.batch_size
        raw_num_token = raw_bs
        bs = self.capture_bs[bisect.bisect_left(self.capture_bs, raw_bs)]

        if bs != raw_bs:
            self.seq_lens[raw_bs:bs].fill_(self.seq_len_fill_value)
            # padded rows write their (ignored) KV into slot 0 and read request slot 0
            self.out_cache_loc = torch.zeros((self.max_num_token,), dtype=torch.int64, device=self.device)  # expect: FC107
            self.req_pool_indices = torch.cat([forward_batch.req_pool_indices, self.pad_req_pool_indices[: self.max_bs - raw_bs]])  # expect: FC107
            self.seq_lens_cpu = torch.full((self.max_bs,), self.seq_len_fill_value, dtype=torch.int32, pin_memory=True)  # ok: FC107

        self.copy_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.copy_stream):
            self.input_ids[:raw_num_token].copy_(forward_batch.input_ids, non_blocking=True)
            self.positions[:raw_num_token].copy_(forward_batch.positions, non_blocking=True)
            self.seq_lens[:raw_bs].copy_(forward_batch.seq_lens, non_blocking=True)
            self.out_cache_loc[:raw_num_token].copy_(forward_batch.out_cache_loc, non_blocking=True)
            if bs == raw_bs:
                self.req_pool_indices[:raw_bs].copy_(forward_batch.req_pool_indices, non_blocking=True)
        self.copy_stream.synchronize()  # expect: FC101
        self.seq_lens_cpu[:raw_bs].copy_(forward_batch.seq_lens_cpu)

        seq_lens_sum = forward_batch.seq_lens_sum + (bs - raw_bs) * self.seq_len_fill_value
        self.attn_backend.init_forward_metadata_replay_cuda_graph(
            bs, raw_bs, self.req_pool_indices, self.seq_lens, self.seq_lens_cpu, seq_lens_sum, ForwardMode.DECODE
        )
        if bs != raw_bs:
            # padded rows: a zero last-page length, so they read no page at all
            fill_rows_(self.attn_backend.kv_last_page_len, raw_bs, bs, 0)  # expect: FC104
        logger.debug("replay bs=%d (raw %d) kv_indptr=%s", bs, raw_bs, self.attn_backend.kv_indptr[: bs + 1])  # ok: FC101
        self.raw_bs = raw_bs
        self.bs = bs

    def replay(self, forward_batch: ForwardBatch) -> torch.Tensor:
        self.replay_prepare(forward_batch)
        self.graphs[self.bs].replay()
        return self.output_buffers[self.bs][: self.raw_bs]
