"""The prompt-cache server: admits requests, copies cache hits in, prefills and decodes."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import numpy as np
import torch

from ecache import EmbeddingLRU, ServerConfig, prompt_hash
from ec_attn.backend import CachedPromptBackend, PrefillBatch
from ec_attn.copy_in import copy_cached_prefix
from ec_server.graphs import DecodeBatch, DecodeGraphs
from ec_server.model import PromptCacheModel


@dataclass
class Request:
    rid: str
    prompt_ids_cpu: torch.Tensor
    adapter: Optional[str] = None
    row: int = -1
    pages: List[int] = field(default_factory=list)
    cache_slot: Optional[int] = None


class PromptServer:
    def __init__(self, cfg: ServerConfig, device: str = "cuda"):
        self.cfg, self.device = cfg, torch.device(device)
        kv_cache = torch.zeros(cfg.num_layers, cfg.num_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim,
                               dtype=torch.bfloat16, device=self.device)
        self.lru = EmbeddingLRU(cfg, self.device)
        self.backend = CachedPromptBackend(cfg, kv_cache, self.lru, self.device)
        self.model = PromptCacheModel(cfg, self.backend).to(self.device)
        self.graphs = DecodeGraphs(self.model, self.backend, cfg, self.device)
        self.free_pages = list(range(cfg.num_pages - 1, 0, -1))
        self.free_rows = list(range(cfg.max_batch_size - 1, -1, -1))
        self.prompt_embeds = torch.empty(cfg.max_prefill_tokens, cfg.hidden_size, dtype=torch.bfloat16,
                                         device=self.device)
        self.graphs.capture_all()

    def _alloc_pages(self, n_tokens: int) -> List[int]:
        n = (n_tokens + self.cfg.page_size - 1) // self.cfg.page_size
        return [self.free_pages.pop() for _ in range(n)]

    def admit(self, requests: List[Request]) -> Tuple[PrefillBatch, bool]:
        keys = [prompt_hash(r.prompt_ids_cpu.tolist(), r.adapter) for r in requests]  # ok: FC101
        lens = [int(r.prompt_ids_cpu.shape[0]) for r in requests]
        slots = self.lru.lookup_batch(keys, lens)
        hits: List[Tuple[int, List[int]]] = []
        for r, slot, n in zip(requests, slots, lens):
            r.row, r.pages, r.cache_slot = self.free_rows.pop(), self._alloc_pages(n + 1), slot
            if slot is not None:
                hits.append((slot, r.pages))
        all_cached = bool(hits) and len(hits) == len(requests)
        if all_cached:
            copy_cached_prefix(self.lru, self.backend.kv_cache[0], hits, self.prompt_embeds, self.device)
        else:
            ids = torch.cat([r.prompt_ids_cpu for r in requests]).to(self.device, non_blocking=True)
            self.prompt_embeds[: ids.shape[0]].copy_(self.model.embed(ids))
        if getattr(self, "_row_scratch", None) is None:
            self._row_scratch = torch.zeros(self.cfg.max_batch_size, dtype=torch.int64, device=self.device)  # ok: FC107
        # seed the decode last-page lengths of the joining rows: the first token lands after the prompt
        lens_np = np.asarray(lens, dtype=np.int32)
        rows = self._row_scratch[: len(requests)]
        rows.copy_(torch.tensor([r.row for r in requests], dtype=torch.int64), non_blocking=True)
        first_last = torch.from_numpy(lens_np % self.cfg.page_size + 1).to(self.device, non_blocking=True)
        self.backend.kv_last_page_len.index_copy_(0, rows, first_last)  # expect: FC104
        return self._prefill_batch(requests, lens_np), all_cached

    def _prefill_batch(self, requests: List[Request], lens_np: np.ndarray) -> PrefillBatch:
        qo_indptr = np.concatenate([[0], np.cumsum(lens_np)]).astype(np.int32)
        counts = np.array([len(r.pages) for r in requests], dtype=np.int32)
        width = int(counts.max())
        tables = np.zeros((len(requests), width), dtype=np.int32)
        for i, r in enumerate(requests):
            tables[i, : len(r.pages)] = r.pages
        flat = np.concatenate([np.asarray(r.pages, dtype=np.int32) for r in requests])
        return PrefillBatch(
            qo_indptr_cpu=torch.from_numpy(qo_indptr),
            kv_indices=torch.from_numpy(flat).to(self.device, non_blocking=True),
            last_page_len_cpu=torch.from_numpy(((lens_np - 1) % self.cfg.page_size + 1).astype(np.int32)),
            page_counts=torch.from_numpy(counts).to(self.device, non_blocking=True),
            seq_lens=torch.from_numpy(lens_np).to(self.device, non_blocking=True),
            block_tables=torch.from_numpy(tables).to(self.device, non_blocking=True),
            max_q_len=int(lens_np.max()),
            max_kv_len=int(lens_np.max()),
        )

    def prefill(self, requests: List[Request]) -> torch.Tensor:
        batch, all_cached = self.admit(requests)
        self.backend.init_forward_metadata(batch)
        total = int(batch.qo_indptr_cpu[-1])
        out_loc = self._out_loc(requests)
        logits = self.model.forward_extend(self.prompt_embeds[:total], out_loc, all_cached)
        for r, slot in zip(requests, [r.cache_slot for r in requests]):
            if slot is None and r.prompt_ids_cpu.shape[0] <= self.cfg.max_cached_prompt_len:
                self._remember(r)
        return logits

    def _out_loc(self, requests: List[Request]) -> torch.Tensor:
        ps = self.cfg.page_size
        locs = [p * ps + t % ps for r in requests for t, p in
                ((t, r.pages[t // ps]) for t in range(int(r.prompt_ids_cpu.shape[0])))]
        return torch.tensor(locs, dtype=torch.int64).to(self.device, non_blocking=True)

    def _remember(self, r: Request) -> None:
        n = int(r.prompt_ids_cpu.shape[0])
        start = 0  # offsets of this request's tokens in prompt_embeds are tracked by the scheduler
        kv0 = self.backend.kv_cache[0][torch.tensor(r.pages, device=self.device)]
        self.lru.insert(prompt_hash(r.prompt_ids_cpu.tolist(), r.adapter), self.prompt_embeds[start : start + n], kv0)

    def decode(self, batch: DecodeBatch) -> torch.Tensor:
        if batch.batch_size > self.graphs.buckets[-1]:
            raise RuntimeError(f"decode batch {batch.batch_size} exceeds the largest bucket")
        return self.graphs.replay(batch)
