"""Decode graphs per bucket, the per-step runner (the hot path) and the engine loop around it."""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional

import numpy as np
import torch
import torch.nn.functional as F

from navit import IMAGE_TOKEN_ID, PAGE_SIZE
from navit.config import VLMConfig
from navit.packing import LMBatch, pack_images
from nv_lm.attention import LMAttention
from nv_lm.model import LMModel
from nv_vision.encoder import EncoderGraphs, VisionEncoder

logger = logging.getLogger(__name__)

_STATIC_INPUTS = ("input_ids", "positions")
_BS_FIELD = "_fixed_batch_size"


def _pad_rows(buf: torch.Tensor, start: int, end: int, value: int) -> None:
    buf[start:end].fill_(value)


@dataclass
class StepInput:
    req_ids: np.ndarray
    slots_np: np.ndarray
    input_ids_np: np.ndarray
    seq_lens_np: np.ndarray
    extend_lens_np: Optional[np.ndarray] = None  # None for a decode step
    images: List[np.ndarray] = field(default_factory=list)


class DecodeGraphs:
    def __init__(self, model: LMModel, attn: LMAttention, buckets: Iterable[int]):
        self.model, self.attn = model, attn
        self.buckets = sorted(buckets)
        self.max_bs = self.buckets[-1]
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.stream = torch.cuda.Stream()
        self.attn.init_graph_wrappers(self.buckets)

    @functools.cached_property
    def input_ids(self) -> torch.Tensor:
        return torch.zeros(self.max_bs, dtype=torch.int64, device=self.attn.device)

    @functools.cached_property
    def positions(self) -> torch.Tensor:
        return torch.zeros(self.max_bs, dtype=torch.int64, device=self.attn.device)

    @functools.cached_property
    def out_loc(self) -> torch.Tensor:
        return torch.zeros(self.max_bs, dtype=torch.int64, device=self.attn.device)

    @functools.cached_property
    def logits(self) -> torch.Tensor:
        return torch.empty(self.max_bs, self.attn.cfg.vocab, dtype=torch.bfloat16, device=self.attn.device)

    def capture_bucket(self, bs: int) -> None:
        if getattr(self.attn.graph_wrappers[bs], _BS_FIELD) != bs:  # expect: FC103
            raise RuntimeError(f"the decode wrapper of bucket {bs} was built for another batch size")
        self.attn.init_capture_metadata(bs)
        ones_cpu = torch.ones(bs, dtype=torch.int32)
        ones = ones_cpu.to(self.attn.device)
        fb = LMBatch(True, bs, self.input_ids[:bs], self.positions[:bs], ones, ones_cpu, ones, ones_cpu, self.out_loc[:bs], graph_bs=bs)
        self.stream.wait_stream(torch.cuda.current_stream())  # ok: FC101
        with torch.cuda.stream(self.stream):
            self.model.decode_step(fb)
        self.stream.synchronize()  # ok: FC101
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=self.stream):
            self.logits[:bs].copy_(self.model.decode_step(fb))
        self.graphs[bs] = g

    def replay(self, fb: LMBatch) -> torch.Tensor:
        assert self.graphs, "no decode graph captured yet"  # ok: FC109
        raw_bs = fb.batch_size
        bs = min(b for b in self.buckets if b >= raw_bs)  # ok: FC101
        if raw_bs == bs:
            for name in _STATIC_INPUTS:
                setattr(self, name, getattr(fb, name).clone())  # expect: FC107
        else:
            self.input_ids[:raw_bs].copy_(fb.input_ids)  # ok: FC104
            self.positions[:raw_bs].copy_(fb.positions)  # ok: FC101
        slots_cpu = F.pad(fb.slots.cpu(), (0, bs - raw_bs))  # expect: FC101
        self.attn.prepare_replay(bs, F.pad(fb.seq_lens_cpu, (0, bs - raw_bs), value=1), slots_cpu)
        self.out_loc[:raw_bs].copy_(fb.out_cache_loc)  # ok: FC104
        self.attn.graph_kv_indptr[raw_bs + 1 : bs + 1] = self.attn.graph_kv_indptr[raw_bs]  # expect: FC104
        _pad_rows(self.attn.graph_last_page_len, raw_bs, bs, 1)  # expect: FC104
        self.graphs[bs].replay()
        return self.logits[:raw_bs]


class VLMRunner:
    def __init__(self, cfg: VLMConfig, device: str = "cuda:0"):
        self.cfg, self.device = cfg, torch.device(device)
        self.page_table_np = np.zeros((cfg.max_batch_size, cfg.max_pages_per_seq), dtype=np.int32)
        self.req_to_page = torch.zeros(cfg.max_batch_size, cfg.max_pages_per_seq, dtype=torch.int32, device=self.device)
        kv_cache = torch.empty(cfg.lm_layers, cfg.num_pages, 2, PAGE_SIZE, cfg.num_kv_heads, cfg.head_dim, dtype=torch.bfloat16, device=self.device)
        self.lm_attn = LMAttention(cfg, self.device, kv_cache, self.page_table_np)
        self.model = LMModel(cfg, self.lm_attn).to(self.device)
        self.encoder = VisionEncoder(cfg, self.device).to(self.device)
        self.enc_graphs = EncoderGraphs(self.encoder, n=4, h=32, w=32)
        self.graphs = DecodeGraphs(self.model, self.lm_attn, cfg.decode_buckets)
        self.vocab_mask = torch.ones(cfg.vocab, dtype=torch.bool, device=self.device)
        self.ids_host = torch.empty(cfg.max_batch_size, dtype=torch.int64, pin_memory=True)
        self.copy_done = torch.cuda.Event()
        self.eos_id, self.eos_seen = 151645, 0
        self._last_grid: Optional[torch.Tensor] = None
        self._last_embeds: Optional[torch.Tensor] = None
        logger.info("language-model attention on %s (%s)", self.device, self.lm_attn._backend)  # ok: FC103

    def warmup(self) -> None:
        assert not self.graphs.graphs, "warmup() ran twice"  # ok: FC109
        self.enc_graphs.capture_grid()
        for bs in self.graphs.buckets:
            self.graphs.capture_bucket(bs)

    def _encode(self, inp: StepInput) -> torch.Tensor:
        packed = pack_images(inp.images, self.device)
        n_placeholders = int((inp.input_ids_np == IMAGE_TOKEN_ID).sum())  # ok: FC101
        if sum(packed.tokens_per_image) != n_placeholders:  # expect: FC101
            raise ValueError(f"{n_placeholders} image placeholders for {packed.tokens_per_image_cpu.tolist()} image tokens")
        if self._last_grid is not None and torch.equal(packed.grid_thw, self._last_grid):  # expect: FC101
            return self._last_embeds
        embeds = self.enc_graphs.replay(packed) if self.enc_graphs.matches(packed) else self.encoder(packed)
        self._last_grid, self._last_embeds = packed.grid_thw, embeds
        return embeds

    def _make_batch(self, inp: StepInput) -> LMBatch:
        bs = len(inp.req_ids)
        seq_lens_cpu, slots_cpu = torch.from_numpy(inp.seq_lens_np).int(), torch.from_numpy(inp.slots_np).int()
        input_ids = torch.from_numpy(inp.input_ids_np).to(self.device, non_blocking=True)
        seq_lens, slots = seq_lens_cpu.to(self.device, non_blocking=True), slots_cpu.to(self.device, non_blocking=True)
        if inp.extend_lens_np is None:
            pos = (seq_lens - 1).long()
            loc = self.req_to_page[slots, pos // PAGE_SIZE].long() * PAGE_SIZE + pos % PAGE_SIZE
            return LMBatch(True, bs, input_ids, pos, seq_lens, seq_lens_cpu, slots, slots_cpu, loc)
        extend_lens_cpu = torch.from_numpy(inp.extend_lens_np).int()
        extend_lens, n = extend_lens_cpu.to(self.device, non_blocking=True), len(inp.input_ids_np)
        row = torch.repeat_interleave(torch.arange(bs, device=self.device), extend_lens, output_size=n)  # ok: FC101
        pos = ((seq_lens - extend_lens)[row] + torch.arange(n, device=self.device) - F.pad(torch.cumsum(extend_lens, 0), (1, 0))[row]).long()
        image_rows = torch.nonzero(input_ids == IMAGE_TOKEN_ID).squeeze(1)  # expect: FC101
        pos[image_rows] = pos[image_rows[:1]].expand_as(image_rows)
        loc = self.req_to_page[slots[row], pos // PAGE_SIZE].long() * PAGE_SIZE + pos % PAGE_SIZE
        return LMBatch(False, bs, input_ids, pos, seq_lens, seq_lens_cpu, slots, slots_cpu, loc, extend_lens, extend_lens_cpu)

    def step(self, inp: StepInput) -> torch.Tensor:
        assert len(inp.req_ids) <= self.cfg.max_batch_size, len(inp.req_ids)  # expect: FC109
        fb = self._make_batch(inp)
        bs = fb.batch_size
        if fb.is_decode and bs <= self.graphs.max_bs:
            logits = self.graphs.replay(fb)
            self.lm_attn.advance_pages(bs, (fb.seq_lens % PAGE_SIZE == 0).int())
            torch.add(self.lm_attn.graph_last_page_len[:bs] % PAGE_SIZE, 1, out=self.lm_attn.graph_last_page_len[:bs])  # expect: FC104
        elif fb.is_decode:
            self.lm_attn.prepare_decode(fb)
            logits = self.model.decode_step(fb)
        else:
            image_embeds = self._encode(inp) if inp.images else None
            self.lm_attn.prepare_prefill(fb)
            logits = self.model.prefill(fb, image_embeds)
        next_ids = torch.argmax(torch.where(self.vocab_mask, logits, float("-inf")), dim=-1)  # ok: FC101
        self.ids_host[:bs].copy_(next_ids, non_blocking=True)  # ok: FC101
        self.eos_seen += int((self.ids_host[:bs] == self.eos_id).sum())  # expect: FC101
        self.copy_done.record()
        return self.ids_host[:bs]


class VLMEngine:
    def __init__(self, cfg: VLMConfig):
        self.runner = VLMRunner(cfg)
        self.outputs: Dict[int, List[int]] = {}

    def step(self, inp: StepInput) -> Dict[int, List[int]]:
        ids = self.runner.step(inp)
        self.runner.copy_done.synchronize()
        for rid, tok in zip(inp.req_ids.tolist(), ids.tolist()):  # ok: FC101
            self.outputs.setdefault(rid, []).append(tok)
        return self.outputs
