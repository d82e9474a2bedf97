"""Decode CUDA graphs, one per batch bucket, sharing one memory pool."""
from __future__ import annotations

import logging
from typing import Callable, Dict, Optional

import torch

from pvlm.config import VLMConfig
from pvlm.tools.mrope import text_positions
from pvlm_srv.attention import DecodeMeta, VLMAttention
from pvlm_srv.model import VLMDecoder

logger = logging.getLogger(__name__)


class DecodeGraphPool:
    def __init__(self, model: VLMDecoder, attn: VLMAttention, cfg: VLMConfig, device: torch.device):
        self.model, self.attn, self.cfg = model, attn, cfg
        max_bs = max(cfg.graph_buckets)
        self.static_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.static_positions = torch.zeros((3, max_bs), dtype=torch.int64, device=device)
        self.static_slots = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.mempool = None

    def bucket(self, n: int) -> Optional[int]:
        return next((bs for bs in self.cfg.graph_buckets if bs >= n), None)

    def warm_up(self, make_meta: Callable[[int], DecodeMeta]) -> None:
        for bs in sorted(self.cfg.graph_buckets, reverse=True):
            self.record_bucket(bs, make_meta(bs))

    def record_bucket(self, bs: int, meta: DecodeMeta) -> None:
        self.static_positions[:, :bs].copy_(text_positions(0, bs))
        self.attn.prepare_decode(bs, meta)
        w = self.attn.decode_wrappers[bs]
        if w._fixed_batch_size != bs:  # expect: FC103
            raise RuntimeError(f"decode wrapper for bucket {bs} was built for another batch size")
        max_pos = self.static_positions[:, :bs].max().item()  # expect: FC101
        logger.info("recording decode bucket %d (positions up to %d)", bs, max_pos)
        torch.cuda.synchronize()  # ok: FC101
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.mempool):
            self.outputs[bs] = self.model.decode(self.static_ids[:bs], self.static_positions[:, :bs], self.static_slots[:bs], bs)
        if self.mempool is None:
            self.mempool = g.pool()
        self.graphs[bs] = g

    def replay(self, bs: int, input_ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        n = input_ids.shape[0]
        self.static_ids[:n].copy_(input_ids)
        self.static_positions[:, :n].copy_(positions)
        self.static_slots[:n].copy_(slots)
        self.static_slots[n:bs].zero_()  # padded rows write into the null page
        self.graphs[bs].replay()
        return self.outputs[bs][:n]
