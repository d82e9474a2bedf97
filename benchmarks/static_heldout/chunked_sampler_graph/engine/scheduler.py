"""Chunked-prefill scheduler: decodes first, then prompt chunks up to the token budget; paged KV per layer group."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Deque, Dict, List, Optional, Tuple

import numpy as np
import torch

from layers.hybrid_attn import GROUPS, StepBatch


@dataclass
class Request:
    rid: str
    prompt_ids: List[int]
    max_new_tokens: int
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    want_logprobs: bool = False
    num_computed: int = 0
    output_ids: List[int] = field(default_factory=list)
    pages: List[int] = field(default_factory=list)

    @property
    def seq_len(self) -> int:
        return self.num_computed + (1 if self.output_ids else 0)


@dataclass
class SamplingParamsBatch:
    temperatures_cpu: torch.Tensor
    top_k_cpu: Optional[torch.Tensor]
    top_p_cpu: torch.Tensor
    all_greedy: bool
    want_logprobs: bool


class BlockAllocator:
    def __init__(self, num_pages: int):
        self.free: List[int] = list(range(num_pages))
        self.refcount = np.zeros(num_pages, dtype=np.int32)
        self._callbacks: Dict[str, List[Callable[[int, int], None]]] = {"cow": [], "free": []}

    def register(self, event: str, fn: Callable[[int, int], None]) -> None:
        self._callbacks[event].append(fn)

    def allocate(self, n: int) -> List[int]:
        pages = [self.free.pop() for _ in range(n)]
        self.refcount[pages] = 1
        return pages

    def copy_on_write(self, page: int) -> int:
        new = self.free.pop()
        self.refcount[page] -= 1
        self.refcount[new] = 1
        for fn in self._callbacks["cow"]:
            fn(page, new)
        return new


class ChunkedScheduler:
    def __init__(self, allocator: BlockAllocator, max_bs: int, max_num_batched_tokens: int, chunk_size: int,
                 max_model_len: int, page_size: int, windows: Dict[str, int], eos_token_id: int, device):
        self.allocator = allocator
        self.max_bs = max_bs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.chunk_size = chunk_size
        self.max_model_len = max_model_len
        self.page_size = page_size
        self.windows = windows
        self.eos_token_id = eos_token_id
        self.device = device
        self.running: List[Request] = []
        self.waiting: Deque[Request] = deque()
        # last step's sampled tokens, one per running request; the engine keeps them on the device
        self.last_tokens: Optional[torch.Tensor] = None
        self.stop_mask_host = np.zeros(max_bs, dtype=bool)

    def add_request(self, req: Request) -> None:
        assert len(req.prompt_ids) + req.max_new_tokens <= self.max_model_len, "request exceeds max_model_len"  # expect: FC109
        self.waiting.append(req)

    def _check_invariants(self) -> None:
        assert len(self.running) <= self.max_bs, "more running requests than graph rows"  # ok: FC109

    def _group_pages(self, req: Request, name: str) -> Tuple[List[int], int]:
        n = req.num_computed
        last = (n - 1) % self.page_size + 1
        if self.windows[name] < 0:
            return req.pages, last
        keep = -(-self.windows[name] // self.page_size) + 1
        return req.pages[-keep:], last

    def _retire(self, finished: List[int]) -> None:
        for i in sorted(set(finished), reverse=True):
            req = self.running.pop(i)
            self.allocator.free.extend(req.pages)

    def schedule(self) -> Tuple[StepBatch, SamplingParamsBatch]:
        n = len(self.running)
        if self.last_tokens is not None and n:
            hit_eos = torch.nonzero(self.last_tokens[:n] == self.eos_token_id).flatten().tolist()  # expect: FC101
            hit_len = np.flatnonzero(self.stop_mask_host[:n]).tolist()  # ok: FC101
            self._retire(hit_eos + hit_len)
        self._check_invariants()
        decodes = list(self.running)
        budget = self.max_num_batched_tokens - len(decodes)
        chunks: List[Tuple[Request, int]] = []
        while self.waiting and budget > 0 and len(decodes) + len(chunks) < self.max_bs:
            req = self.waiting[0]
            take = min(self.chunk_size, len(req.prompt_ids) - req.num_computed, budget)
            need = -(-(req.num_computed + take) // self.page_size) - len(req.pages)
            req.pages.extend(self.allocator.allocate(max(need, 0)))
            chunks.append((req, take))
            budget -= take
            if req.num_computed + take == len(req.prompt_ids):
                self.running.append(self.waiting.popleft())
        ids = [r.output_ids[-1] for r in decodes]
        for req, take in chunks:
            ids.extend(req.prompt_ids[req.num_computed : req.num_computed + take])
            req.num_computed += take
        qo = np.cumsum([0] + [take for _, take in chunks], dtype=np.int32)
        reqs = decodes + [r for r, _ in chunks]
        kv_pages: Dict[str, List[List[int]]] = {g: [] for g in GROUPS}
        last_lens: Dict[str, List[int]] = {g: [] for g in GROUPS}
        for req in reqs:
            for g in GROUPS:
                pages, last = self._group_pages(req, g)
                kv_pages[g].append(pages)
                last_lens[g].append(last)
        batch = StepBatch(
            num_decodes=len(decodes),
            num_prefills=len(chunks),
            input_ids_cpu=torch.tensor(ids, dtype=torch.int64, pin_memory=True),
            kv_pages=kv_pages,
            last_page_lens=last_lens,
            qo_indptr_cpu=torch.from_numpy(qo),
            qo_indptr_gpu=torch.from_numpy(qo).to(self.device, non_blocking=True),
        )
        top_k = [r.top_k if r.top_k > 0 else 0 for r in decodes]
        params = SamplingParamsBatch(
            temperatures_cpu=torch.tensor([r.temperature for r in decodes], dtype=torch.float32),
            top_k_cpu=torch.tensor(top_k, dtype=torch.int32) if any(top_k) else None,
            top_p_cpu=torch.tensor([r.top_p for r in decodes], dtype=torch.float32),
            all_greedy=all(r.temperature == 0 for r in decodes),
            want_logprobs=any(r.want_logprobs for r in decodes),
        )
        return batch, params

    def update(self, tokens: List[int]) -> None:
        for i, (req, tok) in enumerate(zip(self.running, tokens)):
            req.output_ids.append(tok)
            req.num_computed += 1
            self.stop_mask_host[i] = len(req.output_ids) >= req.max_new_tokens
            if req.num_computed % self.page_size == 0:
                req.pages.extend(self.allocator.allocate(1))

    def dummy_batch(self, bs: int) -> StepBatch:
        pages = [[0]] * bs
        return StepBatch(
            num_decodes=bs,
            num_prefills=0,
            input_ids_cpu=torch.zeros(bs, dtype=torch.int64),
            kv_pages={g: pages for g in GROUPS},
            last_page_lens={g: [1] * bs for g in GROUPS},
            qo_indptr_cpu=torch.zeros(1, dtype=torch.int32),
            qo_indptr_gpu=torch.zeros(1, dtype=torch.int32, device=self.device),
        )

    def detokenize(self, tokens: List[int]) -> None:
        for req, tok in zip(self.running, tokens):
            req.text = getattr(req, "text", "") + f"<{tok}>"
