"""Decode CUDA graphs per batch size (SGLang-shaped)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Dict, Optional

import torch

from warmstart.forward_batch import ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from warmstart_rt.model_runner import ModelRunner


class CudaGraphRunner:
    def __init__(self, model_runner: "ModelRunner"):
        self.model_runner = model_runner
        cfg = model_runner.cfg
        self._use_cuda_graph = not cfg.disable_cuda_graph
        self.capture_bs = sorted(cfg.cuda_graph_bs)
        self.max_bs = max(self.capture_bs)
        dev = model_runner.device
        self.input_ids = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.req_pool_indices = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.req_pool_indices_cpu = torch.zeros(self.max_bs, dtype=torch.int64, pin_memory=True)
        self.seq_lens = torch.ones(self.max_bs, dtype=torch.int32, device=dev)
        self.seq_lens_cpu = torch.ones(self.max_bs, dtype=torch.int32, pin_memory=True)
        self.out_cache_loc = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.restore_gen = torch.zeros(self.max_bs, dtype=torch.int32, device=dev)
        # sequence lengths of the rows resumed from a snapshot, to record graphs with
        self.restored_seq_lens: Optional[torch.Tensor] = None
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.mempool = None
        model_runner.attn_backend.init_cuda_graph_state(self.max_bs, cfg.max_total_pages)

    def _static_batch(self, bs: int) -> ForwardBatch:
        return ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=bs,
            input_ids=self.input_ids[:bs],
            positions=self.positions[:bs],
            req_pool_indices=self.req_pool_indices[:bs],
            req_pool_indices_cpu=self.req_pool_indices_cpu[:bs],
            seq_lens=self.seq_lens[:bs],
            seq_lens_cpu=self.seq_lens_cpu[:bs],
            out_cache_loc=self.out_cache_loc[:bs],
            restore_gen=self.restore_gen[:bs],
        )

    def capture(self) -> None:
        if not self._use_cuda_graph:  # ok: FC103
            return
        self.graphs.clear()
        self.outputs.clear()
        for bs in reversed(self.capture_bs):
            self.capture_one_batch_size(bs)

    def capture_one_batch_size(self, bs: int) -> None:
        backend = self.model_runner.attn_backend
        if self.restored_seq_lens is not None:
            if not torch.equal(self.seq_lens[:bs], self.restored_seq_lens[:bs]):  # expect: FC101
                self.seq_lens[:bs].copy_(self.restored_seq_lens[:bs])
        backend.init_forward_metadata_capture_cuda_graph(bs, self.req_pool_indices_cpu[:bs])
        fb = self._static_batch(bs)
        model = self.model_runner.model
        for _ in range(2):
            model.forward_decode(fb)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempool):
            out = model.forward_decode(fb)
        self.mempool = graph.pool()
        self.graphs[bs] = graph
        self.outputs[bs] = out

    def can_run(self, fb: ForwardBatch) -> bool:
        return fb.forward_mode == ForwardMode.DECODE and fb.batch_size in self.graphs

    def replay(self, fb: ForwardBatch) -> torch.Tensor:
        bs = fb.batch_size
        self.input_ids[:bs].copy_(fb.input_ids)
        self.positions[:bs].copy_(fb.positions)
        self.req_pool_indices[:bs].copy_(fb.req_pool_indices)
        self.req_pool_indices_cpu[:bs].copy_(fb.req_pool_indices_cpu)
        self.seq_lens[:bs].copy_(fb.seq_lens)
        self.seq_lens_cpu[:bs].copy_(fb.seq_lens_cpu)
        self.out_cache_loc[:bs].copy_(fb.out_cache_loc)
        self.restore_gen[:bs].copy_(fb.restore_gen)
        self.model_runner.attn_backend.init_forward_metadata_replay_cuda_graph(
            bs, self.req_pool_indices_cpu[:bs], self.seq_lens, self.seq_lens_cpu, self.restore_gen
        )
        self.graphs[bs].replay()
        return self.outputs[bs]
