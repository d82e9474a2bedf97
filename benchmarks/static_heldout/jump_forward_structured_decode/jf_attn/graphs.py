"""Decode graphs per bucket (pure decode steps) and, optionally, small mixed graphs."""

from __future__ import annotations

import bisect
import dataclasses
from typing import Dict, Optional

import numpy as np
import torch

from jf.batch import MixedBatch
from jf.config import JFConfig
from jf.grammar import GrammarMatcherPool, apply_token_bitmask

from .backend import MixedAttnBackend
from .model import JFModel


class DecodeGraphPool:
    def __init__(
        self,
        cfg: JFConfig,
        model: JFModel,
        backend: MixedAttnBackend,
        matchers: GrammarMatcherPool,
        device: torch.device,
    ):
        self.cfg = cfg
        self.model = model
        self.backend = backend
        self.matchers = matchers
        self.device = device
        self.sizes = sorted(cfg.graph_batch_sizes)
        backend.init_graph_buffers(self.sizes)
        n = self.sizes[-1]
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.positions = torch.zeros(n, dtype=torch.int32, device=device)
        self.batch_indices = torch.arange(n, dtype=torch.int32, device=device)
        self.seq_lens = torch.ones(n, dtype=torch.int32, device=device)
        self.slots = torch.zeros(n, dtype=torch.int64, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.out_ids: Dict[int, torch.Tensor] = {}
        self.mixed_graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.mempool = None
        # bucket of the last staged replay, for the step trace
        self._fixed_batch_size: Optional[int] = None

    def bucket(self, bs: int) -> Optional[int]:
        i = bisect.bisect_left(self.sizes, bs)
        return self.sizes[i] if i < len(self.sizes) else None

    def _static_batch(self, bs: int, kv_indptr: torch.Tensor) -> MixedBatch:
        ones = np.ones(bs, dtype=np.int32)
        return MixedBatch(
            seqs=[],
            num_extend=0,
            input_ids=self.input_ids[:bs],
            positions=self.positions[:bs],
            batch_indices=self.batch_indices[:bs],
            qo_indptr=torch.arange(bs + 1, dtype=torch.int32, device=self.device),
            qo_indptr_np=np.arange(bs + 1, dtype=np.int32),
            kv_indptr=kv_indptr,
            kv_indptr_np=np.arange(bs + 1, dtype=np.int32),
            kv_indices=self.backend.graph_kv_indices,
            kv_last_page_len=self.backend.graph_last_page_len[:bs],
            kv_last_page_len_np=ones,
            seq_lens=self.seq_lens[:bs],
            slots=self.slots[:bs],
            last_rows=torch.arange(bs, dtype=torch.int64, device=self.device),
        )

    def _decode_body(self, bs: int, b: MixedBatch) -> torch.Tensor:
        logits = self.model.forward_decode(b)
        logits = apply_token_bitmask(logits, self.matchers.token_bitmask[:bs])
        return torch.argmax(logits, dim=-1)

    def record_bucket(self, bs: int) -> None:
        # the append kernel inside the graph must read the very indptr the wrapper is bound to
        indptr_buf = self.backend.graph_decode[bs]._paged_kv_indptr_buf  # expect: FC103
        b = self._static_batch(bs, indptr_buf)
        if (self.seq_lens[:bs] <= 0).any():  # expect: FC101
            self.seq_lens[:bs].fill_(1)
        self.backend.plan_decode_graph(bs, b)
        self._decode_body(bs, b)
        torch.cuda.synchronize()  # ok: FC101
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.mempool):
            out = self._decode_body(bs, b)
        if self.mempool is None:
            self.mempool = g.pool()
        self.graphs[bs] = g
        self.out_ids[bs] = out
        if self.cfg.capture_mixed and bs <= 8:
            self._record_mixed(bs, b)

    def _record_mixed(self, bs: int, b: MixedBatch) -> None:
        """One jump-forward row of `mixed_graph_tokens` in front of bs - 1 decode rows."""
        mb = dataclasses.replace(b, num_extend=1)
        self.backend.prepare_step(mb)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.mempool):
            self.model.forward_mixed(mb)
        self.mixed_graphs[bs] = g

    def stage_inputs(self, batch: MixedBatch) -> int:
        real = batch.batch_size
        bs = self.bucket(real)
        nnz = int(batch.kv_indptr_np[-1])
        self.input_ids[:real].copy_(batch.input_ids, non_blocking=True)
        self.positions[:real].copy_(batch.positions, non_blocking=True)
        self.seq_lens[:real].copy_(batch.seq_lens, non_blocking=True)
        self.slots[:real].copy_(batch.slots, non_blocking=True)
        self.backend.graph_kv_indices[:nnz].copy_(batch.kv_indices, non_blocking=True)  # ok: FC104
        self.backend.plan_decode_graph(bs, batch)
        # padded rows: empty on the device as well
        self.backend.graph_kv_indptr[real + 1 : bs + 1].fill_(nnz)  # expect: FC104
        self._fixed_batch_size = bs  # ok: FC103
        return bs

    def replay_decode(self, batch: MixedBatch) -> torch.Tensor:
        bs = self.stage_inputs(batch)
        self.graphs[bs].replay()
        return self.out_ids[bs][: batch.batch_size]

    def replay_debug_dump(self, bs: int) -> Dict[str, torch.Tensor]:
        """Operator tool: the static inputs of a bucket as the next replay will read them."""
        return {
            "input_ids": self.input_ids[:bs].cpu(),  # ok: FC101
            "positions": self.positions[:bs].cpu(),
            "kv_indptr": self.backend.graph_kv_indptr[: bs + 1].cpu(),
        }
