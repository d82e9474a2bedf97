"""Sampling from chunked logits: the captured path keeps max_top_k per chunk, the eager path only what it needs."""

from __future__ import annotations

from typing import Optional

import torch
from flashcheck import hot_path

from vocabchunk.head import ChunkedLMHead
from vocabchunk.ops.topk_merge import clamp_top_k, gumbel_pick, merge_chunk_topk
from vocabchunk.params import PenaltyEntries, SamplingTensors, penalty_deltas
from vocabchunk.settings import ChunkSettings


class ChunkedSampler:
    def __init__(self, head: ChunkedLMHead, s: ChunkSettings, device: torch.device, scratch: torch.Tensor) -> None:
        self.head = head
        self.max_bs = s.max_batch
        self.cand_k = s.max_top_k
        c = head.num_chunks
        gb = s.max_graph_bs
        self.cand_vals = torch.empty(gb, c * self.cand_k, dtype=torch.float32, device=device)
        self.cand_ids = torch.empty(gb, c * self.cand_k, dtype=torch.int64, device=device)
        self.eager_vals = torch.empty(s.max_batch, c * 32, dtype=torch.float32, device=device)
        self.out_host = torch.zeros(s.max_batch, dtype=torch.int64, pin_memory=True)
        # borrowed: the eager decode wrapper's float workspace is idle once attention has run
        self.scratch = scratch

    def sample_static(self, hidden: torch.Tensor, t: SamplingTensors, pen: PenaltyEntries) -> torch.Tensor:
        """Captured: max_top_k candidates per chunk, rows with a smaller top-k masked after the merge."""
        n = hidden.shape[0]
        k = self.cand_k
        deltas = penalty_deltas(t, pen)
        self.head.topk_candidates(hidden, k, pen.rows, pen.token_ids, deltas, self.cand_vals[:n], self.cand_ids[:n])
        vals, ids = merge_chunk_topk(self.cand_vals[:n], self.cand_ids[:n], t.top_k, k)
        return gumbel_pick(vals, ids, t.temperature)

    @hot_path
    def sample_eager(self, hidden: torch.Tensor, t: SamplingTensors, pen: Optional[PenaltyEntries]) -> torch.Tensor:
        n = hidden.shape[0]
        c = self.head.num_chunks
        k = clamp_top_k(int(t.top_k.max()), self.cand_k)  # expect: FC101
        if k * c > self.eager_vals.shape[1]:
            self.eager_vals = torch.empty(self.max_bs, k * c, dtype=torch.float32, device=self.cand_vals.device)  # expect: FC107
        vals_buf = self.eager_vals[:n, : k * c]
        ids_buf = torch.empty(n, k * c, dtype=torch.int64, device=self.cand_ids.device)
        if pen is None:
            self.head.topk_candidates(hidden, k, None, None, None, vals_buf, ids_buf)
        else:
            deltas = penalty_deltas(t, pen)
            self.head.topk_candidates(hidden, k, pen.rows, pen.token_ids, deltas, vals_buf, ids_buf)
        vals, ids = merge_chunk_topk(vals_buf, ids_buf, t.top_k, k)
        noise = self.scratch.view(torch.float32)[: vals.numel()].view_as(vals).uniform_()
        next_ids = gumbel_pick(vals, ids, t.temperature, noise)
        self.out_host[:n].copy_(next_ids)  # expect: FC101
        return next_ids
