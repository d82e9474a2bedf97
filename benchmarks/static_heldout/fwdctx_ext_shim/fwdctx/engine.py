"""Engine loop and CUDA graph pool; attention layers read the ForwardContext the engine sets."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from . import _ext
from .backend import FlashInferBackend
from .config import GRAPH_BATCH_SIZES, EngineConfig
from .forward_context import AttnMetadata, get_forward_context, set_forward_context

logger = logging.getLogger(__name__)


@dataclass
class SchedulerOutput:
    num_reqs: int
    num_decodes: int
    num_tokens: int
    query_lens: np.ndarray
    seq_lens: np.ndarray
    page_table: np.ndarray
    defrag_map: torch.Tensor | None = None
    defrag_nnz: int = 0


class GraphPool:
    def __init__(self, backend: FlashInferBackend, cfg: EngineConfig) -> None:
        self.backend = backend
        self.cfg = cfg
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.static_q = torch.zeros(cfg.max_num_seqs, cfg.num_qo_heads, cfg.head_dim,
                                    dtype=torch.float16, device="cuda")
        self.static_out = torch.zeros_like(self.static_q)
        self.kv_cache = torch.zeros(cfg.max_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim,
                                    dtype=torch.float16, device="cuda")

    def capture_all(self, dummy_meta: AttnMetadata) -> None:
        for bs in reversed(GRAPH_BATCH_SIZES):
            self.backend.make_graph_wrapper(bs)
            torch.cuda.synchronize()  # ok: FC101
            logger.info(f"capturing decode graph bs={bs} max_len={dummy_meta.seq_lens.max()}")  # expect: FC101
            logger.info("capturing decode graph bs=%d (%d tokens)", bs, dummy_meta.num_actual_tokens_host)
            g = torch.cuda.CUDAGraph()
            with set_forward_context(dummy_meta, capturing=True), torch.cuda.graph(g):
                self.static_out[:bs] = self.backend.forward_decode(self.static_q[:bs], self.kv_cache, bs)
            self.graphs[bs] = g
        # one mixed bucket for short chunked prefills
        g = torch.cuda.CUDAGraph()
        with set_forward_context(dummy_meta, capturing=True), torch.cuda.graph(g):
            self.static_out[:8] = self.backend.forward_prefill(self.static_q[:8], self.kv_cache)
        self.graphs[-8] = g


class Engine:
    def __init__(self, cfg: EngineConfig, model: Callable[..., torch.Tensor]) -> None:
        self.cfg = cfg
        self.model = model
        self.backend = FlashInferBackend(cfg, torch.device("cuda"))
        self.graph_pool = GraphPool(self.backend, cfg)

    def maybe_defragment(self, sched: SchedulerOutput) -> None:
        if sched.defrag_map is not None:
            self.backend.compact_pages(sched.defrag_map, sched.defrag_nnz)

    def step(self, sched: SchedulerOutput) -> torch.Tensor:
        self.maybe_defragment(sched)
        meta = self.backend.build_step_metadata(
            sched.num_reqs, sched.num_decodes, sched.num_tokens, sched.query_lens, sched.seq_lens, sched.page_table,
        )
        num_tokens = meta.num_actual_tokens
        num_tokens_host = meta.num_actual_tokens_host
        if (meta.seq_lens_cpu > self.cfg.max_model_len).any():  # ok: FC101
            raise ValueError("sequence exceeds max_model_len")
        if (meta.seq_lens >= self.cfg.max_model_len - 1).any():  # expect: FC101
            logger.warning("a sequence reached max_model_len")
        with set_forward_context(meta):
            bs = next((b for b in GRAPH_BATCH_SIZES if b >= sched.num_reqs), None)
            if meta.num_prefills == 0 and bs is not None and bs in self.graph_pool.graphs:
                self.backend.prepare_graph_decode(bs, sched.num_reqs, sched.page_table)
                self.graph_pool.graphs[bs].replay()
                hidden = self.graph_pool.static_out[: sched.num_reqs]
            else:
                hidden = self.model(num_tokens, num_tokens_host)
        return hidden


class Attention(torch.nn.Module):
    """Model-side attention layer: picks the kernel from the ForwardContext."""

    def __init__(self, backend: FlashInferBackend, layer_idx: int) -> None:
        super().__init__()
        self.backend = backend
        self.layer_idx = layer_idx

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                block_tables: torch.Tensor) -> torch.Tensor:
        ctx = get_forward_context()
        meta = ctx.attn_metadata
        _ext.reshape_and_cache(k, v, kv_cache, meta.slot_mapping)
        if meta.num_prefills:
            return self.backend.forward_prefill(q, kv_cache)
        return self.backend.forward_decode_trtllm(q, kv_cache, block_tables)
