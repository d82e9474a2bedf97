"""Decode graphs per batch size; the shared expert's side-stream fork/join is recorded inside each graph."""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict

import torch

from sidemoe.batch import ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from srt.model_runner import ModelRunner

_GRAPH_FLAG = "_use_cuda_graph"


class CudaGraphRunner:
    def __init__(self, model_runner: "ModelRunner"):
        self.model_runner = model_runner
        self.backend = model_runner.attn_backend
        self.streams = model_runner.streams
        cfg = model_runner.cfg
        self.device = model_runner.device
        self.hidden_size = cfg.hidden_size
        self.capture_bs = sorted(cfg.cuda_graph_bs)
        self.max_bs = self.capture_bs[-1]
        dev = self.device
        self.input_ids = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.seq_lens = torch.ones(self.max_bs, dtype=torch.int32, device=dev)
        self.out_cache_loc = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.block_tables = torch.zeros(self.max_bs, cfg.max_pages_per_req, dtype=torch.int32, device=dev)
        self.side_scratch = torch.zeros(self.max_bs * cfg.hidden_size, dtype=torch.bfloat16, device=dev)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.pool = None
        self.backend.init_cuda_graph_state(self.max_bs)

    def _bucket(self, n: int) -> int:
        for bs in self.capture_bs:
            if bs >= n:
                return bs
        raise ValueError(f"batch of {n} exceeds the largest captured size {self.max_bs}")

    def _static_batch(self, bs: int) -> ForwardBatch:
        return ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=bs,
            input_ids=self.input_ids[:bs],
            positions=self.positions[:bs],
            seq_lens=self.seq_lens[:bs],
            seq_lens_cpu=None,
            out_cache_loc=self.out_cache_loc[:bs],
            kv_indptr_cpu=self.backend.kv_indptr_cpu[: bs + 1],
            kv_indices=self.backend.cuda_graph_kv_indices,
            kv_last_page_len=self.backend.cuda_graph_last_page_len[:bs],
            last_page_len_np=None,
            block_tables=self.block_tables[:bs],
            attn_backend=self.backend,
        )

    def capture(self) -> None:
        for bs in reversed(self.capture_bs):
            self.capture_one_batch_size(bs)

    def capture_one_batch_size(self, bs: int) -> None:
        fb = self._static_batch(bs)
        self.backend.init_forward_metadata_capture_cuda_graph(bs, fb)
        for layer in self.model_runner.model.layers:
            layer.moe.prepare_step(fb)
        if not getattr(self.backend.graph_wrappers[bs], _GRAPH_FLAG):  # expect: FC103
            raise RuntimeError(f"decode wrapper for bs={bs} is not in CUDA graph mode")
        model = self.model_runner.model

        def run_once():
            return model.forward_decode_graph(self.input_ids[:bs], self.positions[:bs], fb)

        for _ in range(2):
            run_once()
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = run_once()
        self.pool = graph.pool()
        self.graphs[bs] = graph
        self.outputs[bs] = out

    def replay(self, fb: ForwardBatch) -> torch.Tensor:
        raw_bs = fb.batch_size
        bs = self._bucket(raw_bs)
        need = raw_bs * self.hidden_size
        if self.side_scratch.numel() < need:
            self.side_scratch = torch.empty(need, dtype=torch.bfloat16, device=self.device)  # expect: FC107
        # the previous eager step's shared expert may still be writing on the side stream
        self.streams.shared_done_event.synchronize()  # expect: FC101
        self.input_ids[:raw_bs].copy_(fb.input_ids)
        self.positions[:raw_bs].copy_(fb.positions)
        self.seq_lens[:raw_bs].copy_(fb.seq_lens)
        self.out_cache_loc[:raw_bs].copy_(fb.out_cache_loc)
        self.block_tables[:raw_bs].copy_(fb.block_tables)
        self.backend.init_forward_metadata_replay_cuda_graph(bs, fb)
        self.graphs[bs].replay()
        return self.outputs[bs][:raw_bs]
