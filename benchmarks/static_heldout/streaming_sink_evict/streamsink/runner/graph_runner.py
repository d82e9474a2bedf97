"""SGLang-style graph runner: one decode graph per padded batch size."""
from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

import numpy as np
import torch

from streamsink.forward_batch import ForwardBatch

if TYPE_CHECKING:
    from streamsink.runner.model_runner import SinkModelRunner


class SinkCudaGraphRunner:
    def __init__(self, model_runner: SinkModelRunner):
        self.model_runner = model_runner
        self.backend = model_runner.attn_backend
        cfg = model_runner.cfg
        self.bs_list = sorted(cfg.cuda_graph_bs)
        max_bs = self.bs_list[-1]
        self.input_ids = torch.zeros(max_bs, dtype=torch.int64, device=model_runner.device)
        self.cache_lens = torch.ones(max_bs, dtype=torch.int32, device=model_runner.device)
        self.graphs, self.outputs, self.peak_logit = {}, {}, {}
        self.backend.init_cuda_graph_state()

    def can_run(self, fb: ForwardBatch) -> bool:
        return fb.batch_size <= self.bs_list[-1]

    def capture(self):
        for bs in reversed(self.bs_list):
            self.capture_one_batch_size(bs)

    def _dummy_batch(self, bs: int) -> ForwardBatch:
        ones = np.ones(bs, dtype=np.int32)
        return ForwardBatch(
            batch_size=bs, forward_mode="decode", input_ids=self.input_ids[:bs],
            seq_lens=self.cache_lens[:bs], seq_lens_host=ones, cache_lens=self.cache_lens[:bs], cache_lens_cpu=ones,
            window_pages_host=[np.zeros(1, dtype=np.int32)] * bs,
            sink_pages_host=np.zeros((bs, self.backend.sink_pages), dtype=np.int32), last_page_len_host=ones,
        )

    def capture_one_batch_size(self, bs: int):
        fb = self._dummy_batch(bs)
        self.backend.init_forward_metadata_capture_cuda_graph(bs, fb)
        torch.cuda.synchronize()  # ok: FC101
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = self.model_runner.model(self.input_ids[:bs], self.backend.rope_positions[:bs], fb, use_graph=True)
        self.peak_logit[bs] = out.abs().max().item()  # expect: FC101
        self.graphs[bs], self.outputs[bs] = g, out

    def replay(self, fb: ForwardBatch):
        raw = fb.batch_size
        bs = self.bs_list[bisect.bisect_left(self.bs_list, raw)]
        self.input_ids[:raw].copy_(fb.input_ids, non_blocking=True)
        self.backend.init_forward_metadata_replay_cuda_graph(bs, fb)
        self.graphs[bs].replay()
        return self.outputs[bs][:raw]
