"""KV-quantization decode service: per-step requantization bookkeeping, then a replayed decode graph."""

from __future__ import annotations

import bisect
import contextlib
from typing import Dict, List

import torch
from torch import nn

from .decode import QuantDecodeBackend
from .page_pool import DecodeBatch, KVQuantConfig, QuantPagePool
from .requant import RequantScheduler


class TinyDecoder(nn.Module):
    """Stand-in decoder: q projection, FP8 paged attention through the backend, output projection."""

    def __init__(self, cfg: KVQuantConfig, vocab: int) -> None:
        super().__init__()
        d = cfg.num_heads * cfg.head_dim
        self.embed, self.heads = nn.Embedding(vocab, d), cfg.num_heads
        self.q_proj = nn.ModuleList(nn.Linear(d, d) for _ in range(cfg.num_layers))
        self.o_proj = nn.ModuleList(nn.Linear(d, d) for _ in range(cfg.num_layers))

    def forward(self, input_ids: torch.Tensor, backend: QuantDecodeBackend) -> torch.Tensor:
        h = self.embed(input_ids)
        for i, (q_proj, o_proj) in enumerate(zip(self.q_proj, self.o_proj)):
            q = q_proj(h).view(h.shape[0], self.heads, -1)
            h = h + o_proj(backend.forward_decode(q, i).flatten(1))
        return h @ self.embed.weight.t()


class KVQuantService:
    def __init__(self, cfg: KVQuantConfig, vocab: int, device: torch.device) -> None:
        self.cfg, self.device = cfg, device
        self.pool = QuantPagePool(cfg, device)
        self.backend = QuantDecodeBackend(cfg, self.pool, device)
        self.requant = self.backend.requant = RequantScheduler(self.pool, self.backend)
        self.model = TinyDecoder(cfg, vocab).to(device)
        self.static_ids = torch.zeros(cfg.max_bs, dtype=torch.int64, device=device)
        self.batch_sizes: List[int] = []
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}

    def _dummy_batch(self, bs: int) -> DecodeBatch:
        amax = [torch.zeros(self.cfg.num_pages, 2, device=self.device) for _ in range(self.cfg.num_layers)]
        return DecodeBatch.build([0] * bs, [1] * bs, [[0]] * bs, amax, self.device)

    def capture_decode_graphs(self, batch_sizes: List[int]) -> None:
        self.batch_sizes = sorted(batch_sizes)
        self.backend.init_graph_wrappers(self.batch_sizes)
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.inference_mode())
            pool = torch.cuda.graph_pool_handle()
            for bs in reversed(self.batch_sizes):
                if self.backend.fallback_wrappers[bs]._kv_layout != self.pool.layout:  # expect: FC103
                    raise RuntimeError(f"fallback decode wrapper for bs={bs} disagrees with the page layout")
                self.backend.prepare_decode(bs, self._dummy_batch(bs))
                torch.cuda.synchronize()  # ok: FC101
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self.outputs[bs] = self.model(self.static_ids[:bs], self.backend)
                self.graphs[bs] = graph

    def step(self, fb: DecodeBatch) -> torch.Tensor:
        if torch.isinf(self.pool.k_scale).any():  # expect: FC101
            raise FloatingPointError("a layer's K scale overflowed; its FP8 pages are unusable")
        self.requant.observe(fb.new_page_amax)
        self.backend.scales = torch.cat([self.pool.k_scale[None], self.pool.v_scale[None]])  # expect: FC107
        raw = fb.batch_size
        bs = self.batch_sizes[bisect.bisect_left(self.batch_sizes, raw)]
        self.backend.prepare_decode(bs, fb)
        self.requant.relocate()
        self.static_ids[:raw].copy_(fb.input_ids)
        self.graphs[bs].replay()
        return self.outputs[bs][:raw]
