"""Per-chunk prompt logprobs: computed on device, copied to pinned memory, read by the detokenizer."""

import logging
from typing import TYPE_CHECKING, Dict, List, Tuple

import numpy as np
import torch

from .config import LogprobConfig

if TYPE_CHECKING:
    from plp_exec.metadata import ChunkPrefillMeta

logger = logging.getLogger(__name__)


class PromptLogprobCollector:
    def __init__(self, cfg: LogprobConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.k = cfg.max_prompt_logprobs
        cap = cfg.max_num_tokens
        self.host_logprobs = torch.zeros((cap, self.k + 1), dtype=torch.float32, pin_memory=True)
        self.host_ids = torch.zeros((cap, self.k), dtype=torch.int64, pin_memory=True)
        self.chunk_logprobs = torch.zeros((cap, self.k + 1), dtype=torch.float32, device=device)
        self.copy_event = torch.cuda.Event()
        self.inflight: List[int] = []
        self._plan_info: Dict[int, Tuple[int, int]] = {}
        self.running_scores: Dict[int, float] = {}

    def register(self, req_id: int, prompt_ids: np.ndarray, top_k: int) -> None:
        assert len(prompt_ids) > 1, "prompt logprobs need at least two prompt tokens"  # expect: FC109
        self._plan_info[req_id] = (0, len(prompt_ids) - 1)
        self.running_scores[req_id] = 0.0

    def span(self, req_id: int) -> Tuple[int, int]:
        start, end = self._plan_info[req_id]  # ok: FC103
        return start, end

    def collect_chunk(self, logits: torch.Tensor, meta: "ChunkPrefillMeta") -> torch.Tensor:
        n = meta.num_logprob_rows
        if self.host_logprobs.shape[0] < n:
            self.host_logprobs = torch.zeros((n, self.k + 1), dtype=torch.float32, pin_memory=True)  # ok: FC107
            self.host_ids = torch.zeros((n, self.k), dtype=torch.int64, pin_memory=True)
        rows = logits.index_select(0, meta.logprob_rows)
        lp = torch.log_softmax(rows.float(), dim=-1)
        self.chunk_logprobs = torch.empty((n, self.k + 1), dtype=torch.float32, device=self.device)  # expect: FC107
        self.chunk_logprobs[:, 0] = lp.gather(-1, meta.logprob_targets.unsqueeze(-1)).squeeze(-1)
        top_v, top_i = lp.topk(self.k, dim=-1)
        self.chunk_logprobs[:, 1:] = top_v
        meta.ranks_out = torch.empty(n, dtype=torch.int64, device=self.device)  # ok: FC107
        torch.sum(lp > self.chunk_logprobs[:, :1], dim=-1, out=meta.ranks_out)
        self.host_logprobs[:n].copy_(self.chunk_logprobs, non_blocking=True)  # ok: FC101
        self.host_ids[:n].copy_(top_i, non_blocking=True)
        chosen = self.host_logprobs[:n, 0].tolist()  # expect: FC101
        for rid, (a, b) in meta.row_spans.items():
            self.running_scores[rid] += sum(chosen[a:b])
        self.copy_event.record()
        self.inflight.append(n)
        logger.debug("chunk logprobs %s", lp)  # ok: FC101
        return lp

    def handoff(self) -> Tuple[torch.cuda.Event, int]:
        assert self.inflight, "handoff without a collected chunk"  # ok: FC109
        return self.copy_event, self.inflight[-1]

    def retire(self) -> None:
        if self.inflight:
            self.inflight.pop(0)
