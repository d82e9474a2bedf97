"""Decode worker loop: batch, replay (or run eagerly), sample, advance grammars and page tables."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import flashcheck
import numpy as np
import torch

from engine_rt.attention import DecodeAttention, DecodeBatch
from engine_rt.config import EngineConfig
from engine_rt.model import DecodeModel
from engine_rt.model_graphs import DecodeGraphRunner
from sampling.grammar import GrammarBitmaskStager, TokenMatcher
from sampling.history import TokenHistory
from sampling.params import SamplingBatch, SamplingParams
from sampling.sampler import EagerSampler, GraphSampler

logger = logging.getLogger(__name__)


@dataclass
class EngineRequest:
    req_id: int
    slot: int
    params: SamplingParams
    tokens: List[int]
    pages: List[int]
    max_new_tokens: int
    generated: int = 0
    logprobs: List[list] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return self.generated >= self.max_new_tokens


class Engine:
    def __init__(self, cfg: EngineConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.attn = DecodeAttention(cfg, device)
        self.model = DecodeModel(cfg, self.attn, device).to(device=device, dtype=cfg.dtype)
        self.history = TokenHistory(cfg.max_slots + 1, cfg.vocab_size, device)
        self.grammar = GrammarBitmaskStager(cfg.max_batch, cfg.vocab_size)
        self.sampler = GraphSampler(cfg.vocab_size, cfg.max_batch, cfg.max_slots, self.history, self.grammar, device)
        self.eager_sampler = EagerSampler(cfg.vocab_size, cfg.max_batch, self.history, self.grammar, device)
        self.graphs = DecodeGraphRunner(self.model, self.attn, self.sampler, cfg, device)
        self.tokens_pinned = torch.zeros(cfg.max_batch, dtype=torch.int64, pin_memory=True)
        self.copy_stream = torch.cuda.Stream(device)
        self.requests: Dict[int, EngineRequest] = {}
        self.free_slots = list(range(cfg.max_slots - 1, -1, -1))
        self.free_pages = list(range(cfg.num_pages - 1, 0, -1))

    def start(self) -> None:
        self.attn.init_graph_wrappers(self.graphs.buckets)
        self.graphs.capture_decode_graphs()

    def add_request(self, req_id: int, prompt_ids: List[int], prompt_pages: List[int], params: SamplingParams,
                    max_new_tokens: int, matcher: Optional[TokenMatcher] = None) -> None:
        """Prompt KV arrives from a prefill worker in ``prompt_pages``."""
        slot = self.free_slots.pop()
        self.history.reset_rows([slot], [prompt_ids])
        self.requests[req_id] = EngineRequest(req_id, slot, params, list(prompt_ids), list(prompt_pages), max_new_tokens)
        if matcher is not None:
            self.grammar.add(req_id, matcher)

    def _decode_batch(self, reqs: List[EngineRequest]) -> DecodeBatch:
        ps = self.cfg.page_size
        n = len(reqs)
        seq_lens = np.array([len(r.tokens) for r in reqs], dtype=np.int32)
        n_pages = (seq_lens + ps - 1) // ps
        kv_indptr = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(n_pages, out=kv_indptr[1:])
        indices = np.concatenate([np.asarray(r.pages[:k], dtype=np.int32) for r, k in zip(reqs, n_pages)])
        pos = seq_lens.astype(np.int64) - 1
        slot_pages = np.array([r.pages[p // ps] for r, p in zip(reqs, pos)], dtype=np.int64)
        block_tables = np.zeros((n, int(n_pages.max())), dtype=np.int32)
        for i, (r, k) in enumerate(zip(reqs, n_pages)):
            block_tables[i, :k] = r.pages[:k]
        # rows whose next token opens a page: allocate it now so the next step's table already has it
        opening = np.flatnonzero(seq_lens % ps == 0)
        next_pos = kv_indptr[1:][opening]
        next_ids = np.array([self.free_pages.pop() for _ in opening], dtype=np.int32)
        for i, p in zip(opening, next_ids):
            reqs[i].pages.append(int(p))
        dev = self.device
        return DecodeBatch(
            size=n,
            req_ids=[r.req_id for r in reqs],
            kv_indptr_cpu=torch.from_numpy(kv_indptr),
            kv_indices=torch.from_numpy(indices).to(dev, non_blocking=True),
            last_page_len_cpu=torch.from_numpy(((seq_lens - 1) % ps + 1).astype(np.int32)),
            seq_lens=torch.from_numpy(seq_lens).to(dev, non_blocking=True),
            seq_lens_np=seq_lens,
            input_ids=torch.tensor([r.tokens[-1] for r in reqs], dtype=torch.int64).to(dev, non_blocking=True),
            positions=torch.from_numpy(pos).to(dev, non_blocking=True),
            slot_pages=torch.from_numpy(slot_pages).to(dev, non_blocking=True),
            slot_offsets=torch.from_numpy(pos % ps).to(dev, non_blocking=True),
            block_tables=torch.from_numpy(block_tables).to(dev, non_blocking=True),
            next_page_pos_np=next_pos + np.arange(len(opening), dtype=np.int32),
            next_page_ids_np=next_ids,
        )

    def _append_next_pages(self, batch: DecodeBatch) -> None:
        if batch.next_page_ids_np is None or batch.next_page_ids_np.size == 0:
            return
        pos = torch.from_numpy(batch.next_page_pos_np.astype(np.int64)).to(self.device, non_blocking=True)
        ids = torch.from_numpy(batch.next_page_ids_np).to(self.device, non_blocking=True)
        self.attn.bufs.kv_indices[pos] = ids  # expect: FC104

    def _eager_step(self, batch: DecodeBatch, sb: SamplingBatch, reqs: List[EngineRequest]) -> torch.Tensor:
        long_ctx = int(batch.seq_lens_np.max()) > self.cfg.long_context_threshold
        self.attn.plan_eager(batch)
        logits = self.model.forward_decode_eager(batch.input_ids, batch.positions, batch.slot_pages,
                                                 batch.slot_offsets, batch if long_ctx else None)
        if sb.needs_logprobs:
            tokens, packed = self.eager_sampler.sample_with_logprobs(logits, sb)
            for r, row in zip(reqs, packed):
                r.logprobs.append(row)
            return tokens
        tokens, _ = self.eager_sampler.sample(logits, sb)
        return tokens

    @flashcheck.hot_path
    def step(self) -> int:
        reqs = [r for r in self.requests.values() if not r.done]
        if not reqs:
            return 0
        batch = self._decode_batch(reqs)
        sb = SamplingBatch.build([r.params for r in reqs], [r.slot for r in reqs], batch.req_ids,
                                 self.cfg.vocab_size, self.device)
        bs = self.graphs.bucket_for(batch.size)
        if sb.needs_logprobs or bs is None:
            tokens = self._eager_step(batch, sb, reqs)
        else:
            tokens = self.graphs.replay(batch, sb, bs)
        self._append_next_pages(batch)

        n = batch.size
        self.copy_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.copy_stream):
            self.tokens_pinned[:n].copy_(tokens, non_blocking=True)
        toks_np = self.tokens_pinned[:n].numpy()  # expect: FC101
        self.grammar.advance(batch.req_ids, toks_np)
        torch.cuda.current_stream().wait_stream(self.copy_stream)  # ok: FC101
        for r, t in zip(reqs, toks_np.tolist()):
            r.tokens.append(int(t))
            r.generated += 1
        return n
