"""SuffixDecoding-style drafter: per-request and global suffix tries, no draft model."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Dict, List

import numpy as np
import torch

from sfxserve.config import SpecConfig
from sfxserve.drafter.suffix_tree import SuffixTree

logger = logging.getLogger(__name__)


@dataclass
class DraftProposal:
    req_ids: List[int]
    draft_tokens: torch.Tensor  # [bs, max_draft_len] on the device, -1 where no draft
    draft_lens_cpu: torch.Tensor  # [bs] pinned host int32
    max_len: int


class SuffixDrafter:
    def __init__(self, cfg: SpecConfig, device: torch.device, max_spec_factor: float, min_token_prob: float):
        assert max_spec_factor > 0  # expect: FC109
        self.cfg = cfg
        self.device = device
        self.max_spec_factor = max_spec_factor
        self.min_token_prob = min_token_prob
        self.global_tree = SuffixTree(cfg.max_suffix_depth)
        self.request_trees: Dict[int, SuffixTree] = {}
        self.history: Dict[int, List[int]] = {}
        self.prompt_lens: Dict[int, int] = {}
        self.draft_buf = torch.full(
            (cfg.max_batch_size, cfg.max_draft_len), -1, dtype=torch.int64, device=self.device
        )
        self.draft_lens_cpu = torch.zeros(cfg.max_batch_size, dtype=torch.int32, pin_memory=True)
        self._staging = np.full((cfg.max_batch_size, cfg.max_draft_len), -1, dtype=np.int64)

    # -- request lifecycle -------------------------------------------------------------

    def start_request(self, req_id: int, prompt_ids: List[int]) -> None:
        tree = SuffixTree(self.cfg.max_suffix_depth)
        tree.extend(prompt_ids)
        self.request_trees[req_id] = tree
        self.history[req_id] = list(prompt_ids)
        self.prompt_lens[req_id] = len(prompt_ids)

    def finish_request(self, req_id: int) -> None:
        hist = self.history.pop(req_id)
        # only the response goes into the global trie: prompts are rarely repeated verbatim
        self.global_tree.extend(hist[self.prompt_lens.pop(req_id) :])
        self.request_trees.pop(req_id, None)

    # -- per step ---------------------------------------------------------------------

    def _budget(self, req_id: int) -> int:
        # SuffixDecoding scales the speculation length with the matched pattern length
        ctx = len(self.history[req_id]) - self.prompt_lens[req_id]
        return max(1, min(self.cfg.max_draft_len, int(self.max_spec_factor * (1 + ctx // 16))))

    def propose(self, req_ids: List[int]) -> DraftProposal:
        bs = len(req_ids)
        k = self.cfg.max_draft_len
        self.draft_buf = self.draft_buf.new_full((bs, k), -1)  # expect: FC107
        self._staging[:bs].fill(-1)
        for i, rid in enumerate(req_ids):
            ctx = self.history[rid][-self.cfg.max_suffix_depth :]
            budget = self._budget(rid)
            toks, _ = self.request_trees[rid].speculate(ctx, budget, self.min_token_prob)
            if not toks:
                toks, _ = self.global_tree.speculate(ctx, budget, self.min_token_prob)
            self._staging[i, : len(toks)] = toks
            self.draft_lens_cpu[i] = len(toks)
        self.draft_buf.copy_(torch.from_numpy(self._staging[:bs]), non_blocking=True)
        max_len = int(self.draft_lens_cpu[:bs].max())  # ok: FC101
        return DraftProposal(list(req_ids), self.draft_buf, self.draft_lens_cpu[:bs], max_len)

    def observe(self, req_ids: List[int], target_tokens: torch.Tensor, accept_lens: List[int]) -> List[List[int]]:
        """Feed the verified tokens back into the per-request tries; return them per request."""
        toks = target_tokens.cpu()  # expect: FC101
        rows = toks.numpy()
        out: List[List[int]] = []
        for i, rid in enumerate(req_ids):
            n = accept_lens[i] + 1
            new = rows[i, :n].tolist()  # ok: FC101
            hist = self.history[rid]
            before = len(hist)
            hist.extend(new)
            self.request_trees[rid].extend(hist, new_from=before)
            out.append(new)
        logger.debug("suffix tries: global=%d nodes", self.global_tree.num_nodes)
        return out
