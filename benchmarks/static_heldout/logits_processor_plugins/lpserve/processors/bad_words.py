"""Bad-words filter: a host-side matcher over each request's recent tokens.

The next token of every banned sequence whose prefix the request just produced gets a -inf
bias. A banned sequence completed anyway (across a tokenizer merge) rolls its row back.
"""
from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np
import torch

from lpserve.processors.base import HostLogitsProcessor
from lpserve.registry import register_processor


@register_processor("bad_words")
class BadWordsProcessor(HostLogitsProcessor):
    def __init__(self, cfg, device, attn):
        super().__init__(cfg, device, attn)
        self.vocab = cfg.vocab_size
        self.banned: Dict[int, List[List[int]]] = {}
        self.history: Dict[int, List[int]] = {}
        self._row_mask = np.zeros(cfg.vocab_size, dtype=np.bool_)
        cap = cfg.max_batch_size * cfg.max_bad_words
        self._ban_ids_cpu = torch.zeros(cap, dtype=torch.long, pin_memory=True)
        self._ban_ids: Optional[torch.Tensor] = None

    def add_request(self, rid, req):
        self.banned[rid] = [list(seq) for seq in req.bad_words if seq]
        longest = max((len(seq) for seq in self.banned[rid]), default=1)
        self.history[rid] = list(req.prompt[-longest:])

    def release(self, rid):
        self.banned.pop(rid, None)
        self.history.pop(rid, None)

    def _banned_next(self, rid: int, hist: List[int]) -> List[int]:
        mask = self._row_mask
        mask[:] = False
        for seq in self.banned.get(rid, ()):
            head = seq[:-1]
            if not head or hist[-len(head) :] == head:
                mask[seq[-1]] = True
        return np.flatnonzero(mask).tolist()  # ok: FC101

    def _completes_banned(self, rid: int, hist: List[int]) -> bool:
        return any(len(seq) > 1 and hist[-len(seq) :] == seq for seq in self.banned.get(rid, ()))

    def apply_host(self, batch, bias):
        n = batch.num_rows
        if self._ban_ids is None:
            self._ban_ids = torch.empty(self._ban_ids_cpu.numel(), dtype=torch.long, device=self.device)  # ok: FC107
        prev = batch.last_tokens[:n].tolist()  # expect: FC101
        rows: List[int] = []
        ids: List[int] = []
        for row, (rid, tok) in enumerate(zip(batch.rids, prev)):
            hist = self.history.setdefault(rid, [])
            hist.append(tok)
            if self._completes_banned(rid, hist):
                batch.rollback_rows.append(row)
            for tid in self._banned_next(rid, hist):
                rows.append(row)
                ids.append(tid)
        if not ids:
            return
        k = len(ids)
        flat = torch.tensor(rows, dtype=torch.long) * self.vocab + torch.tensor(ids, dtype=torch.long)
        self._ban_ids_cpu[:k].copy_(flat)
        self._ban_ids[:k].copy_(self._ban_ids_cpu[:k], non_blocking=True)
        bias.view(-1).index_fill_(0, self._ban_ids[:k], float("-inf"))
