"""Decode (and, with MTP, verify) CUDA graphs per batch-size bucket.

Each recorded bucket is a ``SimpleNamespace(graph=..., output=..., meta=...)`` kept in
``self.graphs`` under ``(kind, bs)``; the graph's static inputs live in ``self.static``, a namespace
of device buffers sized for the largest bucket.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from nsserve.records import make_record

logger = logging.getLogger(__name__)


class CudaGraphRunner:
    def __init__(self, model_runner: Any):
        self.model_runner = model_runner
        self.model = model_runner.model
        self.backend = model_runner.attn_backend
        self.cfg = model_runner.cfg
        self.buckets = tuple(self.cfg.graph_batch_sizes)
        self.max_bs = self.buckets[-1]
        self.draft_width = self.cfg.num_draft_tokens + 1
        dev = self.cfg.device
        max_tok = self.max_bs * self.draft_width
        self.static = SimpleNamespace(
            input_ids=torch.zeros(max_tok, dtype=torch.int64, device=dev),
            positions=torch.zeros(max_tok, dtype=torch.int64, device=dev),
            out_cache_loc=torch.zeros(max_tok, dtype=torch.int64, device=dev),
            req_pool_indices=torch.zeros(self.max_bs, dtype=torch.int64, device=dev),
            seq_lens=torch.ones(self.max_bs, dtype=torch.int32, device=dev),
            draft_lens=torch.full((self.max_bs,), self.cfg.num_draft_tokens, dtype=torch.int32, device=dev),
            kv_indices=torch.zeros(self.max_bs, dtype=torch.int32, device=dev),
        )
        self.streams = SimpleNamespace(h2d=torch.cuda.Stream(), capture=torch.cuda.Stream())
        self.graphs: dict[tuple[str, int], SimpleNamespace] = {}
        self.pool: Any = None
        self.backend.init_cuda_graph_state(self.max_bs)

    # ------------------------------------------------------------------ recording
    def _capture_record(self, bs: int, mode: str, tokens_per_req: int = 1) -> SimpleNamespace:
        st = self.static
        ntok = bs * tokens_per_req
        return make_record(
            mode=mode,
            is_decode=mode == "decode",
            batch_size=bs,
            num_tokens=ntok,
            req_ids=[],
            req_ids_np=np.zeros(0, dtype=np.int64),
            input_ids=st.input_ids[:ntok],
            positions=st.positions[:ntok],
            out_cache_loc=st.out_cache_loc[:ntok],
            req_pool_indices=st.req_pool_indices[:bs],
            seq_lens=st.seq_lens[:bs],
            draft_lens=st.draft_lens[:bs],
            seq_lens_cpu=torch.ones(bs, dtype=torch.int32),
            extend_lens_cpu=torch.full((bs,), tokens_per_req, dtype=torch.int32),
            qo_indptr_cpu=torch.arange(0, ntok + 1, tokens_per_req, dtype=torch.int32),
            kv_indptr_cpu=torch.arange(bs + 1, dtype=torch.int32),
            kv_last_page_len_cpu=torch.ones(bs, dtype=torch.int32),
            kv_indices=st.kv_indices[:bs],
            kv_nnz=bs,
        )

    def record_all(self) -> None:
        torch.cuda.synchronize()  # ok: FC101
        for bs in reversed(self.buckets):
            self.record_bucket(bs)
            if self.cfg.enable_mtp_draft:
                self.record_verify_bucket(bs)
        torch.cuda.synchronize()
        logger.info("recorded %d graphs (%s)", len(self.graphs), ", ".join(f"{k}:{b}" for k, b in self.graphs))

    def record_bucket(self, bs: int) -> None:
        step = self._capture_record(bs, "decode")
        meta = self.backend.init_forward_metadata_capture_cuda_graph(bs, step)
        # Warm-up on the capture stream so lazy kernels are loaded before recording.
        with torch.cuda.stream(self.streams.capture):
            self.model(step.input_ids, step.positions, meta)
        g = torch.cuda.CUDAGraph()
        draft_logits = None
        with torch.cuda.graph(g, pool=self.pool, stream=self.streams.capture):
            hidden = self.model(step.input_ids, step.positions, meta)
            logits = self.model.compute_logits(hidden)
            if self.cfg.enable_mtp_draft:
                draft_logits = self.model.draft_forward(hidden, meta)
        self.pool = g.pool()
        self.graphs[("decode", bs)] = SimpleNamespace(graph=g, output=logits, draft_output=draft_logits, meta=meta, draft_tokens=None)

    def record_verify_bucket(self, bs: int) -> None:
        vstep = self._capture_record(bs, "verify", tokens_per_req=self.draft_width)
        vmeta = self.backend.init_forward_metadata_capture_cuda_graph(bs, vstep)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool, stream=self.streams.capture):
            hidden = self.model(vstep.input_ids, vstep.positions, vmeta)
            width = int(vstep.draft_lens.max()) + 1  # expect: FC101
            logits = self.model.compute_logits(hidden).view(bs, width, -1)
        self.pool = g.pool()
        self.graphs[("verify", bs)] = SimpleNamespace(graph=g, output=logits, draft_output=None, meta=vmeta, draft_tokens=None)

    # ------------------------------------------------------------------ replay
    def replay(self, bs: int, step: SimpleNamespace, meta: SimpleNamespace) -> torch.Tensor:
        entry = self.graphs[("decode", bs)]
        n = step.batch_size
        with torch.cuda.stream(self.streams.h2d):
            staged = {"input_ids": step.input_ids, "positions": step.positions, "out_cache_loc": step.out_cache_loc}
            for name, value in staged.items():
                setattr(self.static, name, value.clone())  # expect: FC107
        self.streams.h2d.synchronize()  # expect: FC101
        if entry.draft_tokens is None:
            entry.draft_tokens = torch.zeros(bs, dtype=torch.int64, device=self.cfg.device)  # ok: FC107
        entry.graph.replay()
        out = entry.output
        # Hand `out` to the caller and give the graph a fresh buffer, so the next replay cannot
        # overwrite logits the sampler is still reading.
        entry.__dict__.update(output=torch.empty_like(out))  # expect: FC107
        if entry.draft_output is not None:
            meta.draft_logits = entry.draft_output[:n]
        return out[:n]

    def stats(self) -> dict[str, Any]:
        return {"buckets": list(self.buckets), "graphs": len(self.graphs), "pool": self.pool is not None}
