"""Escalation: the request's prefix (prompt + tokens the small model produced) is re-prefilled on the large
model, into pages of the large tier's pool, and the request continues there."""

from __future__ import annotations

from typing import List

import numpy as np
import torch

from cascade.requests import Request, Tier
from tiers.batch import PrefillBatch
from tiers.runtime import TierRuntime


class PrefixMigrator:
    def __init__(self, small: TierRuntime, large: TierRuntime, token_hist: torch.Tensor, device: torch.device):
        self.small = small
        self.large = large
        self.token_hist = token_hist
        self.device = device

    def migrate(self, reqs: List[Request]) -> torch.Tensor:
        large = self.large
        ps = large.spec.page_size
        lens: List[int] = []
        n_pages: List[int] = []
        tokens: List[int] = []
        kv_pages: List[int] = []
        locs: List[int] = []
        tables = np.zeros((len(reqs), large.spec.max_pages_per_req), dtype=np.int32)
        for i, r in enumerate(reqs):
            prefix = self.token_hist[r.slot, : r.num_tokens].tolist()  # expect: FC101
            npg = (len(prefix) + ps - 1) // ps
            new_slot = large.pool.claim_slot()
            pages = large.pool.alloc(npg)
            large.pool.page_table_np[new_slot, :npg] = pages
            row = large.pool.page_table_np[new_slot, :npg].tolist()  # ok: FC101
            kv_pages.extend(row)
            tables[i, :npg] = row
            locs.extend(row[j // ps] * ps + j % ps for j in range(len(prefix)))
            tokens.extend(prefix)
            lens.append(len(prefix))
            n_pages.append(npg)
            self.small.pool.free(r.pages, r.slot)
            r.tier, r.slot, r.pages = Tier.LARGE, new_slot, pages

        total = sum(lens)
        lens_dev = torch.tensor(lens, dtype=torch.int32, device=self.device)
        qo_indptr = torch.zeros(len(reqs) + 1, dtype=torch.int32, device=self.device)
        torch.cumsum(lens_dev, 0, out=qo_indptr[1:])
        starts = torch.repeat_interleave(qo_indptr[:-1], lens_dev, output_size=total)  # ok: FC101
        positions = torch.arange(total, device=self.device) - starts
        kv_indptr_host = torch.from_numpy(np.concatenate(([0], np.cumsum(n_pages))).astype(np.int32))
        last_host = torch.tensor([n - (p - 1) * ps for n, p in zip(lens, n_pages)], dtype=torch.int32)
        kv_indices_dev = torch.tensor(kv_pages, dtype=torch.int32, device=self.device)
        s = large.spec
        large.attn.prefill_wrapper.plan(  # expect: FC102
            qo_indptr,
            kv_indptr_host,
            kv_indices_dev,
            last_host,
            s.num_qo_heads,
            s.num_kv_heads,
            s.head_dim,
            s.page_size,
            causal=True,
        )
        # seed the large tier's graph page list so the first replay after escalation finds the pages in place
        large.attn.graph_kv_indices[: kv_indices_dev.numel()].copy_(kv_indices_dev)  # expect: FC104
        pb = PrefillBatch(
            batch_size=len(reqs),
            qo_indptr=qo_indptr,
            seq_lens=lens_dev,
            block_tables=torch.from_numpy(tables).to(self.device, non_blocking=True),
            out_loc=torch.tensor(locs, dtype=torch.int64, device=self.device),
            max_q_len=max(lens),
            use_trtllm_context=total >= s.trtllm_context_min,
        )
        tokens_dev = torch.tensor(tokens, dtype=torch.int64, device=self.device)
        logits = large.model.prefill(tokens_dev, positions, pb)
        return logits[qo_indptr[1:].long() - 1]
