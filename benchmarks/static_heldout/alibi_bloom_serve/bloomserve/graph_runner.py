from __future__ import annotations

import bisect
import logging
import math
from typing import Dict

import torch

from bloomserve.forward_batch import ForwardBatch, ForwardMode

logger = logging.getLogger(__name__)


class CudaGraphRunner:
    _STATIC_INPUTS = ("input_ids", "positions", "out_cache_loc")

    def __init__(self, model_runner):
        self.model_runner = model_runner
        self.attn_backend = model_runner.attn_backend
        self.device = model_runner.device
        self.max_bs = model_runner.server_args.cuda_graph_max_bs
        self.capture_bs = [1, 2, 4] + list(range(8, self.max_bs + 1, 8))
        self.attn_backend.init_cuda_graph_state(self.max_bs)
        self.sm_scale = model_runner.model.layers[0].self_attention._sm_scale  # ok: FC103
        self.input_ids = torch.zeros(self.max_bs, dtype=torch.int64, device=self.device)
        self.positions = torch.zeros(self.max_bs, dtype=torch.int64, device=self.device)
        self.out_cache_loc = torch.zeros(self.max_bs, dtype=torch.int64, device=self.device)
        self.req_pool_indices = torch.zeros(self.max_bs, dtype=torch.int32, device=self.device)
        self.seq_lens = torch.ones(self.max_bs, dtype=torch.int32, device=self.device)
        self.seq_lens_cpu = torch.ones(self.max_bs, dtype=torch.int32)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.tokens_in_flight = 0

    def can_run(self, fb: ForwardBatch) -> bool:
        return fb.forward_mode.is_decode() and fb.batch_size <= self.max_bs

    def capture(self) -> None:
        pool = None
        for bs in reversed(self.capture_bs):
            pool = self.capture_one_batch_size(bs, pool)
        torch.cuda.current_stream().synchronize()  # ok: FC101

    def capture_one_batch_size(self, bs: int, pool):
        self.attn_backend.init_forward_metadata_capture_cuda_graph(
            bs, self.req_pool_indices[:bs], self.seq_lens[:bs], self.seq_lens_cpu[:bs])
        dummy_len = math.ceil(self.seq_lens[:bs].float().mean())  # expect: FC101
        logger.debug("capturing bs=%d over dummy rows of %d tokens", bs, dummy_len)
        fb = ForwardBatch(ForwardMode.DECODE, bs, self.input_ids[:bs], self.positions[:bs], self.out_cache_loc[:bs],
                          self.req_pool_indices[:bs], self.seq_lens[:bs], self.seq_lens_cpu[:bs])
        model = self.model_runner.model
        for _ in range(2):
            model(fb.input_ids, fb.positions, fb)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool):
            self.outputs[bs] = model(fb.input_ids, fb.positions, fb)
        self.graphs[bs] = g
        return g.pool()

    def replay(self, fb: ForwardBatch) -> torch.Tensor:
        raw_bs = fb.batch_size
        assert raw_bs <= self.max_bs, "batch too large for the captured graphs"  # expect: FC109
        bs = self.capture_bs[bisect.bisect_left(self.capture_bs, raw_bs)]
        for name in self._STATIC_INPUTS:
            setattr(self, name, getattr(fb, name).clone())  # expect: FC107
        self.tokens_in_flight = sum(fb.seq_lens)  # expect: FC101
        self.req_pool_indices[:raw_bs].copy_(fb.req_pool_indices)
        self.seq_lens[:raw_bs].copy_(fb.seq_lens)
        self.seq_lens_cpu[:raw_bs].copy_(fb.seq_lens_cpu)
        self.seq_lens_cpu[raw_bs:bs].fill_(1)
        max_len_cpu = int(fb.seq_lens_cpu[:raw_bs].max())  # ok: FC101
        logger.info(f"replay bs={raw_bs} padded={bs} max_len={max_len_cpu}")  # ok: FC101
        self.attn_backend.init_forward_metadata_replay_cuda_graph(
            bs, self.req_pool_indices[:bs], self.seq_lens[:bs], self.seq_lens_cpu[:bs])
        # padded rows attend to nothing: repeat the last real offset
        self.attn_backend.kv_indptr[raw_bs + 1 : bs + 1] = self.attn_backend.kv_indptr[raw_bs]  # expect: FC104
        self.graphs[bs].replay()
        return self.outputs[bs][:raw_bs]
