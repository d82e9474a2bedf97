"""Paged KV-cache bookkeeping: page reservation and periodic compaction (``cfg["kv_cache"]``)."""

from __future__ import annotations

from typing import Any, Mapping, Optional

import torch

from nctllm.attn_op import FlashInferAttnOp


class KVCacheManager:
    def __init__(self, cfg: Mapping[str, Any], attn_op: FlashInferAttnOp, device: torch.device):
        kv = {"num_pages": 32768, "defrag_every": 0, "max_pages_per_req": 2048, **cfg.get("kv_cache", {})}
        max_reqs = cfg.get("scheduler", {}).get("max_num_reqs", 256)
        self.attn_op = attn_op
        self.device = device
        self.num_pages = kv["num_pages"]
        self.defrag_every = kv["defrag_every"]
        self.free_pages = list(range(self.num_pages))
        self.page_remap = torch.arange(self.num_pages, dtype=torch.int32, device=device)
        self.req_to_pages = torch.zeros(max_reqs, kv["max_pages_per_req"], dtype=torch.int32, device=device)
        self.reserved = torch.zeros(max_reqs, dtype=torch.int32, device=device)

    def alloc(self, n: int) -> list:
        if n > len(self.free_pages):
            raise MemoryError(f"need {n} KV pages, {len(self.free_pages)} free")
        out, self.free_pages = self.free_pages[:n], self.free_pages[n:]
        return out

    def free(self, pages: list) -> None:
        self.free_pages.extend(pages)

    def plan(self, seq_lens: torch.Tensor, kv_indptr: Optional[torch.Tensor] = None) -> None:
        """Reserve pages for the lengths of this step (a page-budget plan, not attention)."""
        n = seq_lens.numel()
        torch.maximum(self.reserved[:n], seq_lens, out=self.reserved[:n])

    def maybe_compact(self, step: int, nnz: int) -> None:
        if not self.defrag_every or step % self.defrag_every:
            return
        self.compact(nnz)

    def compact(self, nnz: int) -> None:
        order = torch.argsort(self.page_remap)
        self.page_remap.copy_(order.to(torch.int32))
        self.req_to_pages.copy_(self.page_remap[self.req_to_pages.long()])  # ok: FC104
        # the captured decode graphs read the attention op's page list: rewrite it in place
        self.attn_op.kv_indices[:nnz] = self.page_remap[self.attn_op.kv_indices[:nnz].long()]  # expect: FC104
