"""One decode graph per bucket; each graph covers the sliding-window and the full layers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional

import torch

from swahybrid.metadata import ForwardBatch

if TYPE_CHECKING:
    from hyb_srt.model_runner import ModelRunner


class CudaGraphRunner:
    def __init__(self, model_runner: "ModelRunner") -> None:
        self.model_runner = model_runner
        self.backend = model_runner.attn_backend
        cfg = model_runner.cfg
        dev = model_runner.device
        self.window = cfg.window
        self.buckets: List[int] = sorted(cfg.graph_buckets)
        gb = cfg.max_graph_bs
        self.input_ids = torch.zeros(gb, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(gb, dtype=torch.int64, device=dev)
        self.full_loc = torch.zeros(gb, dtype=torch.int64, device=dev)
        self.swa_loc = torch.zeros(gb, dtype=torch.int64, device=dev)
        self.seq_lens = torch.ones(gb, dtype=torch.int32, device=dev)
        self.window_start = torch.zeros(gb, dtype=torch.int64, device=dev)
        self.seq_lens_cpu = torch.ones(gb, dtype=torch.int32)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.mempool: Optional[Any] = None

    def _static_batch(self, bs: int) -> ForwardBatch:
        return ForwardBatch(
            rids=list(range(bs)),
            is_decode=True,
            input_ids=self.input_ids[:bs],
            positions=self.positions[:bs],
            full_loc=self.full_loc[:bs],
            swa_loc=self.swa_loc[:bs],
            seq_lens=self.seq_lens[:bs],
            seq_lens_cpu=self.seq_lens_cpu[:bs],
            window_start=self.window_start[:bs],
        )

    def capture(self) -> None:
        for bs in reversed(self.buckets):
            self.capture_one_batch_size(bs)

    def capture_one_batch_size(self, bs: int) -> None:
        # a dummy row's token sits at its last position
        last_pos = [n - 1 for n in self.seq_lens[:bs].tolist()]  # expect: FC101
        self.positions[:bs].copy_(torch.tensor(last_pos, dtype=torch.int64))
        fb = self._static_batch(bs)
        self.backend.init_forward_metadata_capture_cuda_graph(bs, fb)
        model = self.model_runner.model
        for _ in range(2):
            model.forward_decode(fb)
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempool):
            out = model.forward_decode(fb)
        if self.mempool is None:
            self.mempool = graph.pool()
        self.graphs[bs] = graph
        self.outputs[bs] = out

    def replay(self, fb: ForwardBatch) -> torch.Tensor:
        raw_bs = fb.batch_size
        bs = next(b for b in self.buckets if b >= raw_bs)
        if raw_bs > self.full_loc.numel():
            self.full_loc = self.full_loc.new_zeros(raw_bs)  # expect: FC107
        self.input_ids[:raw_bs].copy_(fb.input_ids, non_blocking=True)
        self.positions[:raw_bs].copy_(fb.positions, non_blocking=True)
        self.full_loc[:raw_bs].copy_(fb.full_loc, non_blocking=True)
        self.swa_loc[:raw_bs].copy_(fb.swa_loc, non_blocking=True)
        self.seq_lens[:raw_bs].copy_(fb.seq_lens, non_blocking=True)
        self.window_start[:raw_bs].copy_(torch.clamp(fb.seq_lens - self.window, min=0))
        # kept for the scheduler's next eviction scan
        self.seq_lens_cpu = fb.seq_lens_cpu.clone()  # ok: FC107
        self.backend.init_forward_metadata_replay_cuda_graph(bs, fb)
        self.graphs[bs].replay()
        return self.outputs[bs][:raw_bs]
