from __future__ import annotations

from typing import TYPE_CHECKING, Dict

import torch

from span_srt.forward_batch import ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from span_srt.model_runner import ModelRunner


class CudaGraphRunner:
    """One graph per decode bucket; every graph covers all head groups of every layer."""

    def __init__(self, model_runner: "ModelRunner"):
        self.model_runner = model_runner
        self.attn_backend = model_runner.attn_backend
        cfg = model_runner.cfg
        self.buckets = sorted(cfg.graph_buckets)
        self.max_bs = self.buckets[-1]
        self.num_groups = len(cfg.groups)
        self.attn_backend.init_cuda_graph_state(self.max_bs)
        with torch.device(model_runner.device):
            self.input_ids = torch.zeros(self.max_bs, dtype=torch.int64)
            self.positions = torch.zeros(self.max_bs, dtype=torch.int64)
            self.req_slots = torch.zeros(self.max_bs, dtype=torch.int64)
            self.seq_lens = torch.ones(self.max_bs, dtype=torch.int32)
            self.out_locs = [torch.zeros(self.max_bs, dtype=torch.int64) for _ in range(self.num_groups)]
        self.req_slots_cpu = torch.zeros(self.max_bs, dtype=torch.int64, pin_memory=True)
        self.seq_lens_cpu = torch.ones(self.max_bs, dtype=torch.int32, pin_memory=True)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.pool = None

    def capture(self) -> None:
        for bs in reversed(self.buckets):
            graph, out = self.capture_one_batch_size(bs)
            self.graphs[bs] = graph
            self.outputs[bs] = out

    def capture_one_batch_size(self, bs: int):
        fb = ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=bs,
            input_ids=self.input_ids[:bs],
            positions=self.positions[:bs],
            req_slots=self.req_slots[:bs],
            req_slots_cpu=self.req_slots_cpu[:bs],
            seq_lens=self.seq_lens[:bs],
            seq_lens_cpu=self.seq_lens_cpu[:bs],
            out_locs=[loc[:bs] for loc in self.out_locs],
            attn_backend=self.attn_backend,
        )
        self.attn_backend.init_forward_metadata_capture_cuda_graph(bs, fb)
        model = self.model_runner.model

        def run_once():
            return model.forward_decode(fb.input_ids, fb.positions, fb)

        for _ in range(2):
            torch.cuda.synchronize()  # ok: FC101
            run_once()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = run_once()
        self.pool = graph.pool()
        return graph, out

    def can_run(self, fb: ForwardBatch) -> bool:
        return fb.forward_mode.is_decode() and fb.batch_size <= self.max_bs

    def replay(self, fb: ForwardBatch) -> torch.Tensor:
        raw_bs = fb.batch_size
        bs = next(b for b in self.buckets if b >= raw_bs)
        if bs != raw_bs:
            self.seq_lens[raw_bs:bs].fill_(1)
            self.req_slots[raw_bs:bs].zero_()
            self.seq_lens_cpu[raw_bs:bs].fill_(1)
            self.req_slots_cpu[raw_bs:bs].zero_()
        self.input_ids[:raw_bs].copy_(fb.input_ids)
        self.positions[:raw_bs].copy_(fb.positions)
        self.req_slots[:raw_bs].copy_(fb.req_slots)
        self.seq_lens[:raw_bs].copy_(fb.seq_lens)
        self.seq_lens_cpu[:raw_bs].copy_(fb.seq_lens_cpu)
        self.req_slots_cpu[:raw_bs].copy_(fb.req_slots_cpu)
        for g in range(self.num_groups):
            self.out_locs[g][:raw_bs].copy_(fb.out_locs[g])
        self.attn_backend.init_forward_metadata_replay_cuda_graph(
            bs, self.seq_lens[:bs], self.seq_lens_cpu[:bs], self.req_slots_cpu[:bs]
        )
        self.graphs[bs].replay()
        return self.outputs[bs][:raw_bs]
