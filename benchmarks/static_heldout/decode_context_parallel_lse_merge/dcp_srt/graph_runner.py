"""One decode graph per batch-size bucket; the all-gathers are captured with it."""
from __future__ import annotations

import bisect
from typing import TYPE_CHECKING, Dict

import torch

from dcp_srt.forward_batch import ForwardBatch

if TYPE_CHECKING:
    from dcp_srt.model_runner import ModelRunner


class CudaGraphRunner:
    def __init__(self, model_runner: "ModelRunner"):
        self.model_runner = model_runner
        self.backend = model_runner.attn_backend
        cfg = model_runner.cfg
        self.q_len = cfg.q_len
        self.sizes = sorted(b for b in cfg.cuda_graph_bs if b <= cfg.max_bs)
        self.max_bs = self.sizes[-1]
        dev = model_runner.device
        max_tok = self.max_bs * self.q_len
        self.input_ids = torch.zeros(max_tok, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(max_tok, dtype=torch.int64, device=dev)
        self.out_cache_loc = torch.zeros(max_tok, dtype=torch.int64, device=dev)
        self.req_pool_indices = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.seq_lens = torch.ones(self.max_bs, dtype=torch.int32, device=dev)
        self.seq_lens_cpu = torch.ones(self.max_bs, dtype=torch.int32)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.pool = None

    def can_run(self, fb: ForwardBatch) -> bool:
        return fb.batch_size <= self.max_bs and fb.q_len == self.q_len

    def _batch(self, bs: int) -> ForwardBatch:
        n = bs * self.q_len
        return ForwardBatch(
            batch_size=bs,
            q_len=self.q_len,
            input_ids=self.input_ids[:n],
            positions=self.positions[:n],
            req_pool_indices=self.req_pool_indices[:bs],
            req_pool_indices_cpu=torch.zeros(bs, dtype=torch.int64),
            seq_lens=self.seq_lens[:bs],
            seq_lens_cpu=self.seq_lens_cpu[:bs],
            out_cache_loc=self.out_cache_loc[:n],
            qo_indptr_cpu=torch.arange(0, n + 1, self.q_len, dtype=torch.int32),
        )

    def capture(self) -> None:
        for bs in reversed(self.sizes):
            self.capture_one_batch_size(bs)

    def capture_one_batch_size(self, bs: int) -> None:
        fb = self._batch(bs)
        self.backend.init_forward_metadata_capture_cuda_graph(bs, fb.num_tokens, self.seq_lens_cpu[:bs])
        model = self.model_runner.model
        for _ in range(2):
            model(fb.input_ids, fb)
        torch.cuda.synchronize()  # ok: FC101
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            out = model(fb.input_ids, fb)
        self.pool = g.pool()
        self.graphs[bs] = g
        self.outputs[bs] = out

    def replay(self, fb: ForwardBatch) -> torch.Tensor:
        n = fb.batch_size
        bs = self.sizes[bisect.bisect_left(self.sizes, n)]
        t, q = n * self.q_len, self.q_len
        self.input_ids[:t].copy_(fb.input_ids)
        self.positions[:t].copy_(fb.positions)
        self.out_cache_loc[:t].copy_(fb.out_cache_loc)
        self.out_cache_loc[t : bs * q].zero_()
        self.req_pool_indices[:n].copy_(fb.req_pool_indices)
        self.seq_lens[:n].copy_(fb.seq_lens)
        self.seq_lens[n:bs].fill_(1)
        self.seq_lens_cpu[:n].copy_(fb.seq_lens_cpu)
        self.seq_lens_cpu[n:bs].fill_(1)
        self.backend.init_forward_metadata_replay_cuda_graph(
            bs, self.req_pool_indices, self.seq_lens, self.seq_lens_cpu, q
        )
        self.graphs[bs].replay()
        return self.outputs[bs][:t]
