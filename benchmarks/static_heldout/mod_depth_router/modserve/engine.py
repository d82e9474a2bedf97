"""The serving loop: a chunked prefill or a decode step per iteration."""
from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Deque, Dict, List, Optional

import numpy as np
import torch

from modserve.attention import DecodeBatch, MoDAttnBackend, PrefillChunk
from modserve.config import MoDConfig
from modserve.graph_runner import MoDGraphRunner
from modserve.model import MoDModel


@dataclass
class Request:
    rid: int
    prompt: List[int]
    max_new_tokens: int
    output: List[int] = field(default_factory=list)
    pages: List[int] = field(default_factory=list)
    routed_pages: List[int] = field(default_factory=list)
    routed_len: int = 0

    @property
    def seq_len(self) -> int:
        return len(self.prompt) + len(self.output)


class MoDEngine:
    def __init__(self, cfg: MoDConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.backend = MoDAttnBackend(cfg, device)
        self.model = MoDModel(cfg, self.backend, device).to(device)
        self.kv_caches = [
            torch.zeros(cfg.max_batch * cfg.max_pages_per_seq, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim, dtype=torch.bfloat16, device=device)
            for _ in range(cfg.num_layers)
        ]
        self.runner = MoDGraphRunner(self.model, self.backend, cfg, self.kv_caches)
        self.waiting: Deque[Request] = collections.deque()
        self.running: List[Request] = []
        self.free_pages: List[int] = list(range(cfg.max_batch * cfg.max_pages_per_seq - 1, 0, -1))
        self.free_routed: List[int] = list(range(cfg.max_batch * cfg.max_pages_per_seq // 4 - 1, 0, -1))
        self._next_rid = 0
        self._running_loop = False
        # host staging, numpy views over pinned tensors
        mb = cfg.max_batch
        self.kv_indptr_pinned = torch.zeros(mb + 1, dtype=torch.int32, pin_memory=True)
        self.kv_indptr_np = self.kv_indptr_pinned.numpy()
        self.last_page_pinned = torch.ones(mb, dtype=torch.int32, pin_memory=True)
        self.routed_indptr_pinned = torch.zeros(mb + 1, dtype=torch.int32, pin_memory=True)
        self.routed_last_pinned = torch.ones(mb, dtype=torch.int32, pin_memory=True)
        self.input_ids = torch.zeros(cfg.max_num_tokens, dtype=torch.int64, device=device)
        self.next_tokens = torch.zeros(mb, dtype=torch.int64, device=device)
        self.next_tokens_cpu = torch.zeros(mb, dtype=torch.int64, pin_memory=True)

    # ---- requests -----------------------------------------------------------------------------
    def add_request(self, prompt: List[int], max_new_tokens: int) -> int:
        assert len(prompt) + max_new_tokens <= self.cfg.max_seq_len, "request too long"  # expect: FC109
        rid = self._next_rid
        self._next_rid += 1
        self.waiting.append(Request(rid, list(prompt), max_new_tokens))
        return rid

    def _take_pages(self, pool: List[int], n: int) -> List[int]:
        assert len(pool) >= n, "page pool exhausted"  # ok: FC109
        return [pool.pop() for _ in range(n)]

    # ---- one iteration ------------------------------------------------------------------------
    def step(self) -> None:
        assert self._running_loop, "call start() first"  # ok: FC109
        if self.waiting:
            self._prefill(self.waiting.popleft())
            return
        if not self.running:
            return
        batch = self._build_decode_batch()
        n = batch.bs
        ids = torch.tensor([r.output[-1] if r.output else r.prompt[-1] for r in self.running], dtype=torch.int64)
        self.input_ids[:n].copy_(ids, non_blocking=True)
        if self.runner.can_run(n):
            logits = self.runner.replay(self.input_ids[:n], batch)
        else:
            self.backend.init_forward_metadata(batch)
            logits = self.model.forward_decode(self.input_ids[:n], self.kv_caches, n)
        torch.argmax(logits, dim=-1, out=self.next_tokens[:n])
        finished = torch.nonzero(self.next_tokens[:n] == self.cfg.eos_token_id)  # expect: FC101
        self._advance_pages(n)
        self.next_tokens_cpu[:n].copy_(self.next_tokens[:n], non_blocking=True)
        self._pending_finished = finished

    def _prefill(self, req: Request) -> None:
        n = len(req.prompt)
        qo = torch.tensor([0, n], dtype=torch.int32)
        chunk = PrefillChunk(n, qo, qo.to(self.device), qo)
        self.backend.plan_prefill_chunk(chunk)
        self.input_ids[:n].copy_(torch.tensor(req.prompt), non_blocking=True)
        self.model.forward_prefill(self.input_ids[:n], self.kv_caches, n)
        req.pages = self._take_pages(self.free_pages, -(-n // self.cfg.page_size))
        self.running.append(req)

    def _advance_pages(self, n: int) -> None:
        """Every row wrote one token into its last dense page."""
        self.backend.full_last_page[:n] += 1  # expect: FC104
        for i, r in enumerate(self.running[:n]):
            if int(self.last_page_pinned[i]) == self.cfg.page_size:  # ok: FC101
                r.pages += self._take_pages(self.free_pages, 1)

    def _build_decode_batch(self) -> DecodeBatch:
        rs = self.running
        n = len(rs)
        ps = self.cfg.page_size
        counts = np.array([len(r.pages) for r in rs], dtype=np.int32)
        self.kv_indptr_np[0] = 0
        np.cumsum(counts, out=self.kv_indptr_np[1 : n + 1])
        last = np.array([(r.seq_len - 1) % ps + 1 for r in rs], dtype=np.int32)
        self.last_page_pinned[:n] = torch.from_numpy(last)
        routed_counts = np.array([len(r.routed_pages) for r in rs], dtype=np.int32)
        self.routed_indptr_pinned[1 : n + 1] = torch.from_numpy(np.cumsum(routed_counts))
        routed_last = np.array([max(r.routed_len - 1, 0) % ps + 1 for r in rs], dtype=np.int32)
        self.routed_last_pinned[:n] = torch.from_numpy(routed_last)
        indices = torch.tensor([p for r in rs for p in r.pages], dtype=torch.int32).to(self.device, non_blocking=True)
        routed_indices = torch.tensor([p for r in rs for p in r.routed_pages], dtype=torch.int32).to(self.device, non_blocking=True)
        seq_lens = torch.tensor([r.seq_len for r in rs], dtype=torch.int32).to(self.device, non_blocking=True)
        routed_lens = torch.tensor([r.routed_len for r in rs], dtype=torch.int32).to(self.device, non_blocking=True)
        return DecodeBatch(
            bs=n,
            seq_lens=seq_lens,
            kv_indptr_cpu=self.kv_indptr_pinned,
            kv_indices=indices,
            kv_last_page_len_cpu=self.last_page_pinned,
            routed_lens=routed_lens,
            routed_indptr_cpu=self.routed_indptr_pinned,
            routed_kv_indices=routed_indices,
            routed_last_page_len=self.routed_last_pinned[:n].to(self.device, non_blocking=True),
            routed_last_page_len_cpu=self.routed_last_pinned,
        )

    # ---- observability ------------------------------------------------------------------------
    def stats(self) -> Dict[str, object]:
        plan_info = self.backend.eager_full._plan_info  # expect: FC103
        return {
            "running": len(self.running),
            "waiting": len(self.waiting),
            "free_pages": len(self.free_pages),
            "decode_plan": plan_info,
        }

    def start(self) -> None:
        self._running_loop = True
        self.backend.init_cuda_graph_state()
