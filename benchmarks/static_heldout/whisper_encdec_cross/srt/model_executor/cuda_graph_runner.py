"""Decoder CUDA graphs, one per padded batch size; the encoder never runs in a graph."""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
from typing import TYPE_CHECKING, Dict

import torch

from srt.model_executor.forward_batch import EncDecForwardBatch

if TYPE_CHECKING:
    from srt.model_executor.model_runner import WhisperModelRunner


class DecoderGraphRunner:
    def __init__(self, model_runner: "WhisperModelRunner") -> None:
        self.model_runner = model_runner
        self.attn_backend = model_runner.attn_backend
        self.capture_bs = [1, 2, 4, 8, 16, 24, 32, 48, 64]
        self.max_bs = max_bs = max(self.capture_bs)
        dev = model_runner.device
        self.input_ids = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self.seq_lens = torch.ones(max_bs, dtype=torch.int32, device=dev)
        self.encoder_lens = torch.zeros(max_bs, dtype=torch.int32, device=dev)
        self.out_cache_loc = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self.seq_lens_cpu = torch.ones(max_bs, dtype=torch.int32)
        self._pad_lens_cpu = torch.ones(max_bs, dtype=torch.int32)
        self.suppress = torch.zeros(model_runner.model_config.vocab_size, dtype=torch.bool, device=dev)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.attn_backend.init_cuda_graph_state(max_bs)
        self.capture()

    def can_run(self, fb: EncDecForwardBatch) -> bool:
        return fb.batch_size <= self.max_bs

    def _static_batch(self, bs: int) -> EncDecForwardBatch:
        src = self.model_runner.model_config.max_source_positions
        return EncDecForwardBatch(
            bs, self.input_ids[:bs], self.positions[:bs], self.seq_lens[:bs], self.seq_lens_cpu[:bs],
            torch.arange(bs, dtype=torch.int32), self.encoder_lens[:bs], torch.full((bs,), src, dtype=torch.int32),
            self.out_cache_loc[:bs], self.model_runner.token_to_kv_pool, self.attn_backend)

    def capture(self) -> None:
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.inference_mode())
            stack.enter_context(self.attn_backend.capturing())
            self.pool = torch.cuda.graph_pool_handle()
            for bs in reversed(self.capture_bs):
                self.graphs[bs], self.outputs[bs] = self.capture_one_batch_size(bs)

    def capture_one_batch_size(self, bs: int):
        fb = self._static_batch(bs)
        self.attn_backend.init_forward_metadata_capture_cuda_graph(bs, fb)
        model = self.model_runner.model

        def run_once() -> torch.Tensor:
            return model(fb.input_ids, fb.positions, fb)

        for _ in range(2):
            run_once()
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = run_once()
        return graph, out

    def replay(self, fb: EncDecForwardBatch) -> torch.Tensor:
        raw_bs = fb.batch_size
        bs = self.capture_bs[bisect.bisect_left(self.capture_bs, raw_bs)]
        self.input_ids[:raw_bs].copy_(fb.input_ids)
        self.positions = torch.cat([fb.positions, self.positions[raw_bs:bs]])  # expect: FC107
        self.seq_lens[:raw_bs].copy_(fb.seq_lens)
        self.encoder_lens[:raw_bs].copy_(fb.encoder_lens)
        self.seq_lens_cpu = torch.cat([fb.seq_lens_cpu, self._pad_lens_cpu[: bs - raw_bs]])  # ok: FC107
        self.attn_backend.init_forward_metadata_replay_cuda_graph(
            bs, raw_bs, dataclasses.replace(fb, seq_lens_cpu=self.seq_lens_cpu))
        self.out_cache_loc[:raw_bs].copy_(fb.out_cache_loc)  # ok: FC104
        # padded requests attend to nothing
        self.attn_backend.kv_indptr[raw_bs + 1 : bs + 1].zero_()  # expect: FC104
        self.graphs[bs].replay()
        logits = self.outputs[bs][:raw_bs]
        if not torch.isfinite(logits).all():  # expect: FC101
            raise RuntimeError("non-finite logits from the decode graph")
        return torch.where(self.suppress, float("-inf"), logits)  # ok: FC101
