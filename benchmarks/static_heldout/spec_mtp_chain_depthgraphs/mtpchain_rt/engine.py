"""The MTP chain engine: one target verify pass, then the chained draft depths."""

import logging
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np
import torch
from torch import nn

import flashcheck
from mtpchain.build.graph_builder import DepthGraphBuilder
from mtpchain.config import MTPConfig
from mtpchain.heads import MTPChain
from mtpchain_rt.attention import ChainAttention
from mtpchain_rt.kv_pool import PagedKVPool
from mtpchain_rt.metadata import DraftState, build_tail_metadata, build_target_metadata
from mtpchain_rt.verifier import ChainVerifier

logger = logging.getLogger(__name__)


@dataclass
class Request:
    req_id: int
    prompt_ids: List[int]
    max_new_tokens: int
    slot: int = -1
    output_ids: List[int] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return len(self.output_ids) >= self.max_new_tokens


class SpecEngine:
    def __init__(self, cfg: MTPConfig, target: nn.Module, embed: nn.Embedding, lm_head: nn.Linear, device="cuda"):
        self.cfg = cfg
        self.device = device
        self.target = target
        self.pool = PagedKVPool(cfg, num_pages=cfg.max_batch_size * cfg.max_pages_per_seq, device=device)
        self.attn = ChainAttention(cfg, self.pool.kv_cache, device)
        self.chain = MTPChain(cfg, cfg.num_mtp_heads, embed, lm_head).to(device)
        self.builder = DepthGraphBuilder(cfg, self.chain, self.attn, device)
        self.verifier = ChainVerifier(cfg, self.attn, device)
        self.live_mask = torch.zeros(cfg.max_batch_size, dtype=torch.bool, device=device)
        self.seq_lens_cpu = torch.zeros(cfg.max_batch_size, dtype=torch.int32, pin_memory=True)
        self.running: List[Request] = []
        self.waiting: List[Request] = []
        self._free_slots = list(range(cfg.max_batch_size))
        self.requests: Dict[int, Request] = {}

    def add_request(self, req_id: int, prompt_ids: List[int], max_new_tokens: int = 256) -> None:
        assert len(prompt_ids) + max_new_tokens <= self.cfg.max_seq_len  # expect: FC109
        req = Request(req_id, list(prompt_ids), max_new_tokens)
        self.requests[req_id] = req
        self.waiting.append(req)

    def warmup(self) -> None:
        self.builder.capture_all()

    def _admit(self) -> None:
        while self.waiting and self._free_slots:
            req = self.waiting.pop(0)
            req.slot = self._free_slots.pop()
            self.pool.attach(req.req_id, req.slot, len(req.prompt_ids))
            self.running.append(req)

    @flashcheck.hot_path
    def step(self) -> Dict[int, List[int]]:
        self._admit()
        if not self.running:
            return {}
        bs = len(self.running)
        slots = [r.slot for r in self.running]
        depth = self.cfg.num_mtp_heads
        seq_lens_np = self.pool.seq_lens_np[slots]
        self.seq_lens_cpu[:bs] = torch.from_numpy(seq_lens_np.astype(np.int32))
        self.pool.sync_page_table(bs)

        # 1. target verify pass over the last step's bonus token and drafts
        meta = build_target_metadata(seq_lens_np, self.pool.page_table[:bs], depth, self.cfg.page_size, self.device)
        self.attn.plan_target_verify(meta)
        tail = build_tail_metadata(self.pool.tail_pages(slots, depth), np.full(bs, depth, dtype=np.int64), self.device)
        self.attn.plan_tail(tail)
        tokens = self.builder.static_tokens[:bs]
        hidden, logits = self.target(tokens.reshape(-1), self.attn)
        result = self.verifier.verify(tokens, logits, bs)

        # 2. emit accepted tokens
        emitted = result.tokens.tolist()  # expect: FC101
        counts = []
        for req, row in zip(self.running, emitted):
            kept = [t for t in row if t >= 0]
            req.output_ids.extend(kept)
            counts.append(len(kept))
            self.pool.grow(req.slot, int(self.seq_lens_cpu[slots.index(req.slot)]) + len(kept))  # ok: FC101
        self.verifier.commit_host_lengths(counts, bs)

        # 3. chain the MTP depths: depth d's input is depth d-1's proposal
        next_tokens = result.tokens[:, 0]
        self.builder.static_tokens = torch.cat([next_tokens[:, None], self.builder.static_tokens[:bs, :-1]], dim=1)  # expect: FC107
        state = DraftState(live=self.live_mask[:bs])
        graph_bs = self.cfg.bucket_for(bs)
        h = hidden.view(bs, depth + 1, -1)[:, 0]
        for d in range(depth):
            pages = self.pool.tail_pages(slots, d + 1)
            counts_np = np.array([len(p) for p in pages], dtype=np.int32)
            indptr_np = np.concatenate([[0], np.cumsum(counts_np)]).astype(np.int32)
            flat = torch.from_numpy(np.concatenate(pages)).to(self.device, non_blocking=True)
            last_np = ((seq_lens_np + d) % self.cfg.page_size + 1).astype(np.int32)
            self.attn.replay_prepare_depth(d, graph_bs, indptr_np, flat, last_np)
            h, tok = self.builder.replay(d, graph_bs, h, bs)
            state.depth_reached = d + 1
        if state.num_live < bs:
            self._retire_finished()
        if self.cfg.use_trtllm_target:
            self.attn.forward_target_trtllm(
                self.builder.static_hidden[0][:bs], 0, self.pool.page_table, self.seq_lens_cpu.to(self.device), bs
            )
        return {r.req_id: r.output_ids for r in self.running}

    def _retire_finished(self) -> None:
        keep = []
        for req in self.running:
            if req.done:
                self._free_slots.append(req.slot)
            else:
                keep.append(req)
        self.running = keep
