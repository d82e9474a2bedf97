"""Decoder CUDA graphs per batch size, and the server that drives encode and decode steps."""
from __future__ import annotations

import dataclasses
import logging
from typing import Dict, List, Optional, Tuple

import torch

from t5srv.attention import DecodeBatch, EncoderBatch, EncoderKVCache, T5AttnBackend
from t5srv.config import ServeLimits, T5Config
from t5srv.model import T5ForConditionalGeneration

logger = logging.getLogger(__name__)


class DecoderGraphRunner:
    def __init__(self, server: "T5Server"):
        self.backend = server.backend
        self.model = server.model
        limits = server.limits
        self.capture_bs = sorted(limits.cuda_graph_bs)
        self._use_cuda_graph = len(self.capture_bs) > 0
        max_bs = self.capture_bs[-1] if self._use_cuda_graph else 1
        with torch.device(server.device):
            self.input_ids = torch.zeros(max_bs, dtype=torch.int64)
            self.positions = torch.zeros(max_bs, dtype=torch.int64)
            self.out_cache_loc = torch.zeros(max_bs, dtype=torch.int64)
            self.req_pool_indices = torch.zeros(max_bs, dtype=torch.int32)
        # every dummy request: one full encoder page, one decoder token
        self.dummy_cache = EncoderKVCache(max_bs, max_bs, limits.page_size, limits.page_size, server.device)
        self.dummy_cache.set_rows([[i] for i in range(max_bs)], [limits.page_size] * max_bs, [limits.page_size] * max_bs)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.pool: Optional[Tuple[int, int]] = None
        if self._use_cuda_graph:  # ok: FC103
            self.backend.init_cuda_graph_state()
            self.capture()

    def _static(self, bs: int) -> DecodeBatch:
        return DecodeBatch(
            bs, self.input_ids[:bs], self.positions[:bs], self.req_pool_indices[:bs], torch.ones(bs, dtype=torch.int32),
            self.out_cache_loc[:bs], self.dummy_cache,
        )

    def capture(self) -> None:
        for bs in reversed(self.capture_bs):
            self.graphs[bs], self.outputs[bs] = self.capture_one_batch_size(bs)

    def capture_one_batch_size(self, bs: int) -> Tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        self.backend.init_forward_metadata_capture_cuda_graph(bs, self._static(bs))
        self.model.decode_step(self.input_ids[:bs], self.out_cache_loc[:bs], self.backend)
        if not torch.isfinite(self.backend.cross_out[:bs]).all():  # expect: FC101
            raise RuntimeError(f"non-finite cross-attention output in the warm-up decode for bs={bs}")
        torch.cuda.current_stream().synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = self.model.decode_step(self.input_ids[:bs], self.out_cache_loc[:bs], self.backend)
        self.pool = graph.pool()
        return graph, out

    def can_run(self, raw_bs: int) -> bool:
        return self._use_cuda_graph and raw_bs <= self.capture_bs[-1]

    def replay(self, dec: DecodeBatch) -> torch.Tensor:
        raw_bs = dec.batch_size
        bs = next(b for b in self.capture_bs if b >= raw_bs)
        self.input_ids[:raw_bs].copy_(dec.input_ids)
        self.positions[:raw_bs].copy_(dec.positions)
        self.out_cache_loc[:raw_bs].copy_(dec.out_cache_loc)
        self.req_pool_indices[:raw_bs].copy_(dec.req_pool_indices)
        static = dataclasses.replace(
            dec, input_ids=self.input_ids[:bs], positions=self.positions[:bs], req_pool_indices=self.req_pool_indices[:bs]
        )
        self.backend.init_forward_metadata_replay_cuda_graph(bs, raw_bs, static)
        self.graphs[bs].replay()
        return self.outputs[bs][:raw_bs]


class T5Server:
    def __init__(self, cfg: T5Config, limits: ServeLimits, device: torch.device):
        self.cfg = cfg
        self.limits = limits
        self.device = device
        pages_per_req = (limits.max_decoder_len + limits.page_size - 1) // limits.page_size
        self.req_to_page = torch.zeros(limits.max_batch + 1, pages_per_req, dtype=torch.int32, device=device)
        self.backend = T5AttnBackend(cfg, limits, self.req_to_page, device)
        self.model = T5ForConditionalGeneration(cfg).to(device)
        self.backend.load_rel_bias(self.model.encoder_rel_bias.weight, self.model.decoder_rel_bias.weight)
        self.enc_cache = EncoderKVCache(limits.max_batch, limits.num_cross_pages, limits.max_encoder_len, limits.page_size, device)
        self.free_cross_pages: List[int] = list(range(limits.num_cross_pages))
        self.graph_runner = DecoderGraphRunner(self)

    def encode(self, prompts: List[List[int]]) -> List[List[int]]:
        """Run the encoder over a padded batch; returns each request's cross pages."""
        padded_len = max(len(p) for p in prompts)
        ids = torch.zeros(len(prompts), padded_len, dtype=torch.int64)
        mask = torch.zeros(len(prompts), padded_len, dtype=torch.bool)
        for i, p in enumerate(prompts):
            ids[i, : len(p)] = torch.tensor(p)
            mask[i, : len(p)] = True
        batch = EncoderBatch(ids.to(self.device), mask.to(self.device))
        self.backend.plan_encoder(batch)
        enc_out = self.model.encode(batch.input_ids, self.backend)
        n_pages = (padded_len + self.limits.page_size - 1) // self.limits.page_size
        pages = [[self.free_cross_pages.pop() for _ in range(n_pages)] for _ in prompts]
        loc = torch.tensor([pg * self.limits.page_size + j for row in pages for pg in row for j in range(self.limits.page_size)][: len(prompts) * padded_len])
        self.model.fill_cross_kv(enc_out, loc.to(self.device), self.backend)
        return pages

    def decode_step(self, dec: DecodeBatch) -> torch.Tensor:
        if self.graph_runner.can_run(dec.batch_size):
            logits = self.graph_runner.replay(dec)
        else:
            self.backend.init_forward_metadata(dec)
            logits = self.model.decode_step(dec.input_ids, dec.out_cache_loc, self.backend)
        return torch.argmax(logits, dim=-1)

    def can_admit(self, bs: int, encoder_len: int) -> bool:
        return self.backend.mask_capacity_ok(bs, (bs * encoder_len + 7) // 8)

    def release_encoder_pages(self, pages: List[int]) -> None:
        self.free_cross_pages.extend(pages)
        # scrub the graph's cross indices so a padded row never reads a page now owned by another request
        self.backend.cross_kv_indices.zero_()  # expect: FC104
