from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from tforge.model_executor.forward_batch import ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from tforge.model_executor.model_runner import ModelRunner

logger = logging.getLogger(__name__)


@dataclass
class StepStats:
    num_replays: int = 0
    padded_rows: int = 0
    max_seq_len: int = 0


class CudaGraphRunner:
    def __init__(self, model_runner: "ModelRunner"):
        self.model_runner = model_runner
        cfg = model_runner.cfg
        self.capture_bs = sorted(b for b in cfg.cuda_graph_bs if b <= cfg.max_batch_size)
        self.max_bs = self.capture_bs[-1]
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.pool = None
        self.stream = torch.cuda.Stream()
        self.stats = StepStats()
        self.device = model_runner.device
        model_runner.attn_backend.init_cuda_graph_state(self.max_bs, cfg.max_pages_per_req)
        self.input_ids = torch.zeros(self.max_bs, dtype=torch.int64, device=self.device)
        self.positions = torch.zeros(self.max_bs, dtype=torch.int64, device=self.device)
        self.req_pool_indices = torch.zeros(self.max_bs, dtype=torch.int64, device=self.device)
        self.seq_lens = torch.ones(self.max_bs, dtype=torch.int32, device=self.device)
        self.seq_lens_cpu = torch.ones(self.max_bs, dtype=torch.int32)
        self.out_cache_loc = torch.zeros(self.max_bs, dtype=torch.int64, device=self.device)

    def can_run(self, batch: ForwardBatch) -> bool:
        return batch.batch_size <= self.max_bs

    def _padded(self, raw_bs: int) -> int:
        return self.capture_bs[bisect.bisect_left(self.capture_bs, raw_bs)]

    def _dummy_batch(self, bs: int) -> ForwardBatch:
        mr = self.model_runner
        return ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=bs,
            input_ids=self.input_ids[:bs],
            positions=self.positions[:bs],
            req_pool_indices=self.req_pool_indices[:bs],
            seq_lens=self.seq_lens[:bs],
            seq_lens_cpu=self.seq_lens_cpu[:bs],
            out_cache_loc=self.out_cache_loc[:bs],
            sampling_info=mr._make_dummy_batch(bs, ForwardMode.DECODE).sampling_info,
        )

    # ---- capture ---------------------------------------------------------------------
    def capture(self) -> None:
        torch.cuda.synchronize()  # ok: FC101
        for bs in reversed(self.capture_bs):
            assert bs <= self.max_bs  # ok: FC109
            graph, out = self.capture_one_batch_size(bs)
            self._register_graph(bs, graph, out, log_stats=False)
        logger.info("captured %d decode graphs", len(self.graphs))

    def capture_one_batch_size(self, bs: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        mr = self.model_runner
        batch = self._dummy_batch(bs)
        mr.attn_backend.init_forward_metadata_capture_cuda_graph(bs, self.req_pool_indices[:bs], self.seq_lens[:bs])

        def run_once() -> torch.Tensor:
            return mr._dummy_run(bs, batch=batch, for_capture=True, skip_sampler=True, log_stats=False)

        for _ in range(2):
            run_once()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool, stream=self.stream):
            out = run_once()
        if self.pool is None:
            self.pool = g.pool()
        return g, out

    def _register_graph(self, bs: int, graph: torch.cuda.CUDAGraph, out: torch.Tensor, log_stats: bool) -> None:
        self.graphs[bs] = graph
        self.outputs[bs] = out
        if log_stats:
            self._report_graph(bs)

    def _report_graph(self, bs: int) -> None:
        backend = self.model_runner.attn_backend
        w = backend.decode_cuda_graph_wrappers[bs]
        plan_info = w._plan_info  # expect: FC103
        logger.info(f"graph bs={bs}: kv_indptr={backend.cuda_graph_kv_indptr[: bs + 1]} plan={plan_info}")  # ok: FC101

    # ---- replay ----------------------------------------------------------------------
    def _record_step_stats(self, batch: ForwardBatch, bs: int) -> None:
        self.stats.num_replays += 1
        self.stats.padded_rows += bs - batch.batch_size
        self.stats.max_seq_len = max(self.stats.max_seq_len, int(batch.seq_lens.max()))  # expect: FC101

    def _fill_graph_inputs(self, batch: ForwardBatch, raw_bs: int, bs: int, log_stats: bool) -> None:
        self.input_ids[:raw_bs].copy_(batch.input_ids)
        self.positions[:raw_bs].copy_(batch.positions)
        self.req_pool_indices[:raw_bs].copy_(batch.req_pool_indices)
        self.seq_lens[:raw_bs].copy_(batch.seq_lens)
        self.seq_lens_cpu[:raw_bs].copy_(batch.seq_lens_cpu)
        if raw_bs < bs:
            self.seq_lens[raw_bs:bs].fill_(1)
            self.seq_lens_cpu[raw_bs:bs].fill_(1)
        self.out_cache_loc = batch.out_cache_loc.clone()  # expect: FC107
        if log_stats:
            self._record_step_stats(batch, bs)

    def replay(self, batch: ForwardBatch) -> torch.Tensor:
        assert self.graphs, "capture() must run before replay()"  # ok: FC109
        raw_bs = batch.batch_size
        bs = self._padded(raw_bs)
        self._fill_graph_inputs(batch, raw_bs, bs, log_stats=self.model_runner.log_stats)
        self.model_runner.attn_backend.init_forward_metadata_replay_cuda_graph(
            bs, raw_bs, self.req_pool_indices[:bs], self.seq_lens_cpu[:bs])
        self.graphs[bs].replay()
        return self.outputs[bs][:raw_bs]
