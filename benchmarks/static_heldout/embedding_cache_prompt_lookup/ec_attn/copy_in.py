"""Copies cached embeddings and layer-0 KV of prompt-cache hits into the running batch."""
from __future__ import annotations

from typing import List, Tuple

import torch

from flashcheck import hot_path

from ecache import EmbeddingLRU


class CopyPlan:
    """Per-step gather/scatter positions of one copy-in."""

    def __init__(self, n_tokens: int, n_rows: int, device):
        self.emb_rows = torch.empty(n_tokens, dtype=torch.int64, device=device)  # ok: FC107
        self.kv_src = torch.empty(n_tokens, dtype=torch.int64, device=device)
        self.kv_dst = torch.empty(n_tokens, dtype=torch.int64, device=device)
        self.n_tokens, self.n_rows = n_tokens, n_rows


@hot_path
def copy_cached_prefix(lru: EmbeddingLRU, kv0_cache: torch.Tensor, hits: List[Tuple[int, List[int]]],
                       out_embeds: torch.Tensor, device) -> CopyPlan:
    """``hits`` holds (cache slot, destination pages) per hit row; returns the plan it ran."""
    lens_host = [int(lru.lens_hostbuf[slot]) for slot, _ in hits]  # ok: FC101
    total = sum(lens_host)
    plan = CopyPlan(total, len(hits), device)
    ps = lru.page_size
    lens = torch.tensor(lens_host, dtype=torch.int64).to(device, non_blocking=True)
    slots = torch.tensor([slot for slot, _ in hits], dtype=torch.int64).to(device, non_blocking=True)
    dst_pages = torch.tensor([p for _, pages in hits for p in pages], dtype=torch.int64).to(device, non_blocking=True)
    page_starts = torch.tensor([0] + [len(pages) for _, pages in hits][:-1], dtype=torch.int64).cumsum(0)
    row_of_tok = torch.repeat_interleave(torch.arange(len(hits), device=device), lens, output_size=total)  # ok: FC101
    tok = torch.arange(total, device=device) - (torch.cumsum(lens, 0) - lens)[row_of_tok]
    # embeddings: one row of the store per cached token
    slot_of_tok = torch.repeat_interleave(slots, lens)  # expect: FC101
    torch.add(slot_of_tok * lru.max_prompt_len, tok, out=plan.emb_rows)
    out_embeds[:total].copy_(lru.emb_store.view(-1, lru.emb_store.shape[-1]).index_select(0, plan.emb_rows))
    # layer-0 KV: the slot's pages in the store -> the request's own pages
    page_in_row = tok // ps
    torch.add((slot_of_tok * lru.pages_per_slot + page_in_row) * ps, tok % ps, out=plan.kv_src)
    dst_page = dst_pages[page_starts.to(device, non_blocking=True)[row_of_tok] + page_in_row]
    torch.add(dst_page * ps, tok % ps, out=plan.kv_dst)
    kv0_cache[plan.kv_dst // ps, :, plan.kv_dst % ps] = lru.kv0_store[plan.kv_src // ps, :, plan.kv_src % ps]
    return plan
