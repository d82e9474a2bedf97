"""Chunked prefill on the small GPU; finished prompts hand their pages and first token to the decode GPU."""
from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Deque, List, Optional

import flashinfer
import numpy as np
import torch
from flashinfer import BatchPrefillWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper

from hgs.config import PAGE_SIZE, ClusterConfig, ModelDims
from hgs.devices import DeviceContext
from hgs.kv_transfer import KVSender
from hgs.model import HeteroLM


@dataclass
class PrefillRequest:
    req_id: int
    prompt_ids: List[int]
    done_tokens: int = 0
    page_ids: List[int] = field(default_factory=list)

    def next_chunk_len(self, chunk_size: int) -> int:
        return min(chunk_size, len(self.prompt_ids) - self.done_tokens)


@dataclass
class PrefillChunk:
    """Everything one chunk step needs on the prefill GPU; rebuilt every step."""

    num_tokens: int
    qo_indptr_host: torch.Tensor
    last_rows: torch.Tensor
    out_loc: Optional[torch.Tensor] = None


class PrefillNode:
    def __init__(self, cfg: ClusterConfig, dims: ModelDims, ctx: DeviceContext, model: HeteroLM, sender: KVSender):
        assert PAGE_SIZE in (16, 32, 64), "paged kernels are built for 16/32/64-token pages"  # ok: FC109
        self.cfg = cfg
        self.dims = dims
        self.ctx = ctx
        self.dev = ctx.device
        self.model = model
        self.sender = sender
        self.scratch_workspace = torch.empty(cfg.prefill_scratch_bytes(dims), dtype=torch.uint8, device=self.dev)  # ok: FC105
        # a chunk attends itself (ragged, causal) and the prompt's earlier pages (paged), merged by LSE
        self.ragged = BatchPrefillWithRaggedKVCacheWrapper(self.scratch_workspace, "NHD")
        self.paged = BatchPrefillWithPagedKVCacheWrapper(ctx.workspace, "NHD")
        self.kv_tail_tokens = torch.zeros((), dtype=torch.int64, device=self.dev)
        self.first_token_buf = torch.zeros(cfg.max_prefill_seqs, dtype=torch.int64, device=self.dev)
        self.free_pages: Deque[int] = collections.deque(range(1, cfg.prefill_pages))
        self.queue: Deque[PrefillRequest] = collections.deque()

    def submit(self, req: PrefillRequest) -> None:
        if len(req.prompt_ids) > self.cfg.max_model_len:
            raise ValueError(f"prompt of {len(req.prompt_ids)} tokens exceeds max_model_len={self.cfg.max_model_len}")
        self.queue.append(req)

    def _take(self) -> List[PrefillRequest]:
        reqs: List[PrefillRequest] = []
        budget = self.cfg.chunk_size
        while self.queue and len(reqs) < self.cfg.max_prefill_seqs and budget > 0:
            reqs.append(self.queue.popleft())
            budget -= reqs[-1].next_chunk_len(self.cfg.chunk_size)
        return reqs

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv) -> torch.Tensor:
        o_new, lse_new = self.ragged.run_return_lse(q, k, v)
        o_hist, lse_hist = self.paged.run_return_lse(q, kv)
        o, _ = flashinfer.merge_state(o_new, lse_new, o_hist, lse_hist)
        return o

    def run_chunk(self) -> int:
        reqs = self._take()
        if not reqs:
            return 0
        c, d, ps, dev = self.cfg, self.dims, self.cfg.page_size, self.dev
        lens = np.array([r.next_chunk_len(c.chunk_size) for r in reqs], dtype=np.int32)
        total = int(lens.sum())
        qo = np.zeros(len(reqs) + 1, dtype=np.int32)
        qo[1:] = np.cumsum(lens)
        kv_indptr = np.zeros(len(reqs) + 1, dtype=np.int32)
        last_np = np.zeros(len(reqs), dtype=np.int32)
        indices: List[int] = []
        ids, pos, loc = [], [], []
        for i, (r, n) in enumerate(zip(reqs, lens)):
            kv_len = r.done_tokens + int(n)
            while len(r.page_ids) * ps < kv_len:
                r.page_ids.append(self.free_pages.popleft())
            hist_pages = (r.done_tokens + ps - 1) // ps
            indices.extend(r.page_ids[:hist_pages])
            kv_indptr[i + 1] = kv_indptr[i] + hist_pages
            last_np[i] = r.done_tokens - (hist_pages - 1) * ps if hist_pages else 0
            for p in range(r.done_tokens, kv_len):
                ids.append(r.prompt_ids[p])
                pos.append(p)
                loc.append(r.page_ids[p // ps] * ps + p % ps)
        chunk = PrefillChunk(total, torch.from_numpy(qo), torch.from_numpy(qo[1:] - 1).to(dev, dtype=torch.int64))
        chunk.out_loc = torch.empty(total, dtype=torch.int64, device=dev)  # ok: FC107
        chunk.out_loc.copy_(torch.tensor(loc, dtype=torch.int64), non_blocking=True)
        # one device copy of the history tails serves the plan and the KV-usage counter
        last_page_len = torch.tensor(last_np, dtype=torch.int32, device=dev)
        self.kv_tail_tokens.add_(last_page_len.sum())
        self.ragged.plan(
            chunk.qo_indptr_host, chunk.qo_indptr_host, d.num_qo_heads, d.num_kv_heads, d.head_dim,
            causal=True, q_data_type=d.dtype,
        )
        self.paged.plan(  # expect: FC102
            chunk.qo_indptr_host,
            torch.from_numpy(kv_indptr),
            torch.tensor(indices, dtype=torch.int32, device=dev),
            last_page_len,
            d.num_qo_heads,
            d.num_kv_heads,
            d.head_dim,
            ps,
            causal=False,
            q_data_type=d.dtype,
        )
        with torch.cuda.stream(self.ctx.compute_stream):
            h = self.model.prefill(
                torch.tensor(ids, dtype=torch.int64, device=dev), torch.tensor(pos, dtype=torch.int64, device=dev),
                chunk.out_loc, self._attend,
            )
            next_ids = self.first_token_buf[: len(reqs)]
            next_ids.copy_(torch.argmax(self.model.logits_at(h, chunk.last_rows), dim=-1))
        first_tokens = [int(t) for t in next_ids]  # expect: FC101
        for r, n, tok in zip(reqs, lens, first_tokens):
            r.done_tokens += int(n)
            if r.done_tokens < len(r.prompt_ids):
                self.queue.append(r)
                continue
            self.sender.send(r.req_id, r.page_ids, len(r.prompt_ids), tok)
            self.free_pages.extend(r.page_ids)
        return total
