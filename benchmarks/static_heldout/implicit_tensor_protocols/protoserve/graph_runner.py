"""Captures decode steps as CUDA graphs, one per padded batch size, and replays them."""

import bisect
import logging
from typing import TYPE_CHECKING, Dict, List

import torch

from protoserve.forward_batch import ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from protoserve.model_runner import ModelRunner

logger = logging.getLogger(__name__)


def capture_batch_sizes(max_bs: int) -> List[int]:
    sizes = [1, 2, 4, 8] + list(range(16, max_bs + 1, 8))
    return [bs for bs in sizes if bs <= max_bs]


class CudaGraphRunner:
    def __init__(self, model_runner: "ModelRunner"):
        self.model_runner = model_runner
        self.device = model_runner.device
        self.capture_bs = capture_batch_sizes(model_runner.cfg.cuda_graph_max_bs)
        self.max_bs = self.capture_bs[-1]
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.pool = None

        # Static inputs the captured graphs read by address.
        self.input_ids = torch.zeros(self.max_bs, dtype=torch.int64, device=self.device)
        self.positions = torch.zeros(self.max_bs, dtype=torch.int64, device=self.device)
        self.req_pool_indices = torch.zeros(self.max_bs, dtype=torch.int64, device=self.device)
        self.seq_lens = torch.ones(self.max_bs, dtype=torch.int32, device=self.device)
        self.out_cache_loc = torch.zeros(self.max_bs, dtype=torch.int64, device=self.device)
        self.seq_lens_cpu = torch.ones(self.max_bs, dtype=torch.int32, pin_memory=True)
        self.req_pool_indices_cpu = torch.zeros(self.max_bs, dtype=torch.int32, pin_memory=True)

        model_runner.attn_backend.init_cuda_graph_state(self.max_bs)

    def can_run(self, fb: ForwardBatch) -> bool:
        return fb.forward_mode.is_decode() and fb.batch_size <= self.max_bs

    def _static_batch(self, bs: int) -> ForwardBatch:
        return ForwardBatch(
            forward_mode=ForwardMode.DECODE, batch_size=bs,
            input_ids=self.input_ids[:bs], positions=self.positions[:bs],
            req_pool_indices=self.req_pool_indices[:bs], req_pool_indices_cpu=self.req_pool_indices_cpu[:bs],
            seq_lens=self.seq_lens[:bs], seq_lens_cpu=self.seq_lens_cpu[:bs],
            seq_lens_sum=int(self.seq_lens_cpu[:bs].sum()),
            out_cache_loc=self.out_cache_loc[:bs], use_cuda_graph=True,
        )

    def capture(self) -> None:
        for bs in reversed(self.capture_bs):
            graph, out = self.capture_one_batch_size(bs)
            self.graphs[bs] = graph
            self.outputs[bs] = out
        logger.info("captured %d decode graphs (max bs %d)", len(self.graphs), self.max_bs)

    def capture_one_batch_size(self, bs: int):
        backend = self.model_runner.attn_backend
        model = self.model_runner.model
        fb = self._static_batch(bs)
        backend.init_forward_metadata_capture_cuda_graph(bs, self.req_pool_indices_cpu, self.seq_lens_cpu)

        def run_once():
            return model.decode_step(fb.input_ids, fb.positions, fb)

        for _ in range(2):
            torch.cuda.synchronize()  # ok: FC101
            run_once()

        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = run_once()
        self.pool = graph.pool()
        return graph, out

    def replay(self, fb: ForwardBatch) -> torch.Tensor:
        raw_bs = fb.batch_size
        bs = self.capture_bs[bisect.bisect_left(self.capture_bs, raw_bs)]
        num_tokens = fb.input_ids.shape[0]
        if num_tokens > self.input_ids.shape[0]:
            # draft-verify steps feed several tokens per request
            self.input_ids = torch.zeros(num_tokens, dtype=torch.int64, device=self.device)  # expect: FC107
        if bs != raw_bs:
            self.seq_lens[raw_bs:bs].fill_(1)
            self.req_pool_indices[raw_bs:bs].zero_()
            self.out_cache_loc[raw_bs:bs].zero_()
            self.seq_lens_cpu[raw_bs:bs].fill_(1)
            self.req_pool_indices_cpu[raw_bs:bs].zero_()
        self.input_ids[:raw_bs].copy_(fb.input_ids)
        self.positions[:raw_bs].copy_(fb.positions)
        self.req_pool_indices[:raw_bs].copy_(fb.req_pool_indices)
        self.seq_lens[:raw_bs].copy_(fb.seq_lens)
        self.out_cache_loc[:raw_bs].copy_(fb.out_cache_loc)
        self.seq_lens_cpu[:raw_bs].copy_(fb.seq_lens_cpu)  # ok: FC101
        self.req_pool_indices_cpu[:raw_bs].copy_(fb.req_pool_indices_cpu)

        self.model_runner.attn_backend.init_forward_metadata_replay_cuda_graph(
            bs, raw_bs, self.req_pool_indices_cpu, self.seq_lens_cpu
        )
        self.graphs[bs].replay()
        return self.outputs[bs][:raw_bs]
