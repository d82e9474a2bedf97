"""Decode and short-extend CUDA graphs, one per padded batch bucket."""
from __future__ import annotations

import logging
from typing import Optional

import torch

from ulysses_sp.attn.backend import UlyssesFlashInferBackend
from ulysses_sp.batch import DecodeInputs, ForwardBatch
from ulysses_sp.config import SPConfig
from ulysses_sp.model import UlyssesLlama

logger = logging.getLogger(__name__)


class UlyssesGraphRunner:
    def __init__(
        self,
        model: UlyssesLlama,
        backend: UlyssesFlashInferBackend,
        cfg: SPConfig,
        kv_caches: list,
        device: torch.device,
    ):
        self.model = model
        self.backend = backend
        self.cfg = cfg
        self.kv_caches = kv_caches
        self.device = device
        max_tokens = max(max(cfg.graph_buckets), max(b * q for b, q in cfg.extend_buckets))
        self.input_ids = torch.zeros(max_tokens, dtype=torch.int64, device=device)
        self.positions = torch.zeros(max_tokens, dtype=torch.int32, device=device)
        self.batch_indices = torch.zeros(max_tokens, dtype=torch.int32, device=device)
        self._pad_positions = torch.zeros(max_tokens, dtype=torch.int32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.extend_graphs: dict[tuple, tuple] = {}
        self.pool: Optional[tuple] = None

    def _dummy_inputs(self, bs: int) -> DecodeInputs:
        ones = torch.ones(bs, dtype=torch.int32, pin_memory=True)
        return DecodeInputs(
            num_reqs=bs,
            num_pages=bs,
            seq_lens=torch.ones(bs, dtype=torch.int32, device=self.device),
            kv_indptr_cpu=torch.arange(bs + 1, dtype=torch.int32).pin_memory(),
            kv_indices=torch.zeros(bs, dtype=torch.int32, device=self.device),
            last_page_len_cpu=ones,
            last_page_len=ones.to(self.device),
        )

    def record_bucket(self, bs: int) -> None:
        fb = self.backend.capture_forward_batch(bs, self.input_ids, self.positions, self.batch_indices)
        nnz = self.backend.kv_indptr[bs].item()  # expect: FC101
        if nnz != bs:
            raise RuntimeError(f"dummy decode plan for bucket {bs} must read one page per row, got {nnz}")
        torch.cuda.synchronize()  # ok: FC101
        for _ in range(2):
            self.model.forward_decode(self.input_ids[:bs], self.kv_caches, fb)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            out = self.model.forward_decode(self.input_ids[:bs], self.kv_caches, fb)
        if self.pool is None:
            self.pool = g.pool()
        self.graphs[bs] = g
        self.outputs[bs] = out

    def record_extend(self, bs: int, q_len: int) -> None:
        tokens = bs * q_len
        dec = self._dummy_inputs(bs)
        self.backend.plan_extend(torch.arange(0, tokens + 1, q_len, dtype=torch.int32), dec)
        fb = ForwardBatch(
            batch_size=bs,
            input_ids=self.input_ids[:tokens],
            positions=self.positions[:tokens],
            batch_indices=self.batch_indices[:tokens],
            kv_indptr=self.backend.kv_indptr[: bs + 1],
            kv_indices=self.backend.kv_indices,
            kv_last_page_len=self.backend.kv_last_page_len[:bs],
        )
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            out = self.model.forward_extend(self.input_ids[:tokens], self.kv_caches, fb)
        self.extend_graphs[(bs, q_len)] = (g, out)

    def replay(self, bs: int, fb: ForwardBatch) -> torch.Tensor:
        assert self.pool is not None, "replay before any bucket was recorded"  # ok: FC109
        n = fb.batch_size
        self.input_ids[:n].copy_(fb.input_ids)
        self.positions = torch.cat([fb.positions, self._pad_positions[: bs - n]])  # expect: FC107
        self.batch_indices[:n].copy_(fb.batch_indices)
        self.graphs[bs].replay()
        return self.outputs[bs][:n]
