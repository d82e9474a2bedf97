"""Temperature / top-k sampling over the rows of a hybrid step."""
from __future__ import annotations

from typing import Optional

import torch


class Sampler:
    def __init__(self, vocab_size: int, max_num_seqs: int, device: torch.device):
        self.vocab_size = vocab_size
        self.max_num_seqs = max_num_seqs
        self.device = device
        self.greedy_buf: Optional[torch.Tensor] = None
        self.penalty_counts = torch.zeros(max_num_seqs, vocab_size, dtype=torch.int32, device=device)

    def sample(self, logits: torch.Tensor, temperatures: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
        n = logits.shape[0]
        # the repetition-penalty window restarts with every step's batch
        self.penalty_counts = torch.zeros(n, self.vocab_size, dtype=torch.int32, device=logits.device)  # expect: FC107
        if self.greedy_buf is None:
            self.greedy_buf = torch.empty(self.max_num_seqs, dtype=torch.int64, device=logits.device)  # ok: FC107
        greedy = self.greedy_buf[:n]
        greedy.copy_(logits.argmax(dim=-1))
        scaled = logits / temperatures.clamp_min(1e-5).unsqueeze(1)
        topk_rows = torch.nonzero(top_k > 0).squeeze(1)  # expect: FC101
        if topk_rows.numel():
            rows = scaled.index_select(0, topk_rows)
            kth = torch.topk(rows, int(self.vocab_size // 8), dim=-1).values
            cutoff = kth.gather(1, (top_k.index_select(0, topk_rows) - 1).clamp_min(0).unsqueeze(1).long())
            rows = rows.masked_fill(rows < cutoff, float("-inf"))
            scaled.index_copy_(0, topk_rows, rows)
        probs = torch.softmax(scaled.float(), dim=-1)
        sampled = torch.multinomial(probs, 1).squeeze(1)
        return torch.where(temperatures <= 1e-5, greedy, sampled)  # ok: FC101
