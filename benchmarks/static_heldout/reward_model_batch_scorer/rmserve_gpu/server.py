"""The scoring loop. Each step packs waiting (prompt, response) pairs into one ragged prefill, reads the
reward head, and hands rows that asked for a critique to the critique decoder. The policy model shares the
GPU: every step borrows it through `policy.yield_gpu()`."""

from __future__ import annotations

import collections
import logging
import queue
import threading
from typing import Deque, Dict, List, Tuple

import numpy as np
import torch

from rmserve.batching import RaggedBatch, ScoreRequest, pack_requests
from rmserve.protocols import PolicyHandle
from rmserve.settings import RewardSettings
from rmserve_gpu.critique import CritiqueBatch, CritiqueDecoder
from rmserve_gpu.model import RewardModel
from rmserve_gpu.pages import CritiquePagePool
from rmserve_gpu.score_attention import RaggedScoreAttention

logger = logging.getLogger(__name__)


class RewardServer:
    def __init__(self, settings: RewardSettings, policy: PolicyHandle, device: str = "cuda"):
        self.settings = settings
        self.policy = policy
        self.device = torch.device(device)
        torch.cuda.set_per_process_memory_fraction(settings.gpu_share, self.device)
        self.attn = RaggedScoreAttention(settings, self.device)
        self.kv_pool = CritiquePagePool(settings, self.device)
        self.model = RewardModel(settings, self.attn, self.kv_pool).to(self.device).eval()
        self.critique = CritiqueDecoder(settings, self.model, self.kv_pool, self.device)
        self.waiting: Deque[ScoreRequest] = collections.deque()
        self.scores_pinned = torch.zeros(settings.max_score_requests, dtype=torch.float32, pin_memory=True)
        # (mean, std) of raw rewards on the calibration set, refreshed by the trainer
        self.calib_gpu = torch.tensor([0.0, 1.0], dtype=torch.float32, device=self.device)
        self.copy_stream = torch.cuda.Stream(self.device)
        self.results: Dict[str, float] = {}
        self._publish_q: "queue.Queue[Tuple[torch.cuda.Event, List[str], int]]" = queue.Queue()
        self.attn.share_workspace_with(policy)
        self.critique.graph_pool.record_all()
        self._publisher = threading.Thread(target=self._publish_loop, daemon=True)
        self._publisher.start()

    def submit(self, rid: str, prompt_ids: List[int], response_ids: List[int], critique: bool = False) -> None:
        assert len(response_ids) > 0, "nothing to score"  # expect: FC109
        self.waiting.append(ScoreRequest(rid, list(prompt_ids), list(response_ids), critique=critique))

    def _take(self) -> List[ScoreRequest]:
        taken: List[ScoreRequest] = []
        budget = self.settings.max_batch_tokens
        while self.waiting and len(taken) < self.settings.max_score_requests:
            r = self.waiting[0]
            n = len(r.prompt_ids) + len(r.response_ids)
            if n > budget:
                break
            budget -= n
            taken.append(self.waiting.popleft())
        return taken

    def _attach_critique_rows(self, batch: RaggedBatch, reqs: List[ScoreRequest], lens_np: np.ndarray) -> None:
        """Rows that will generate a critique keep their KV: page them and tell the layers where to store."""
        if not batch.critique_rows:
            return
        cu = batch.cu_seqlens_cpu.numpy()
        tok_idx, locs = [], []
        for row in batch.critique_rows:
            n = int(lens_np[row])
            self.kv_pool.alloc(reqs[row].rid, n)
            tok_idx.append(np.arange(cu[row], cu[row] + n))
            locs.append(self.kv_pool.out_locs(reqs[row].rid, 0, n))
        batch.critique_tok_idx_gpu = torch.from_numpy(np.concatenate(tok_idx)).to(self.device, non_blocking=True)
        batch.critique_out_loc_gpu = torch.from_numpy(np.concatenate(locs)).to(self.device, non_blocking=True)

    @torch.inference_mode()
    def score_step(self) -> Dict[str, float]:
        reqs = self._take()
        if not reqs:
            return {}
        s = self.settings
        batch, lens_np = pack_requests(reqs, self.device, s.response_segment_id)
        n_tokens = int(batch.cu_seqlens_cpu[-1])  # ok: FC101
        if n_tokens > s.max_batch_tokens:
            raise ValueError(f"packed {n_tokens} tokens over the budget; cu_seqlens={batch.cu_seqlens_gpu}")  # ok: FC101
        self._attach_critique_rows(batch, reqs, lens_np)
        with self.policy.yield_gpu():
            self.attn.plan_batch(batch)
            hidden = self.model.forward_score(batch)
            last_hidden = hidden.index_select(0, batch.last_index_gpu)  # ok: FC101
            scores = (self.model.head(last_hidden) - self.calib_gpu[0]) / self.calib_gpu[1]
            if s.per_token_rewards:
                resp_mask = batch.segment_ids_gpu == s.response_segment_id
                resp_hidden = hidden[resp_mask]  # expect: FC101
                token_rewards = self.model.token_head(resp_hidden)
                per_row = torch.zeros_like(scores).index_add_(0, batch.resp_row_ids_gpu, token_rewards)
                scores = scores + per_row / batch.resp_counts_gpu
        n = len(reqs)
        if n > self.scores_pinned.numel():
            self.scores_pinned = torch.zeros(2 * n, dtype=torch.float32, pin_memory=True)  # ok: FC107
        self.copy_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.copy_stream):
            self.scores_pinned[:n].copy_(scores, non_blocking=True)
        vals = self.scores_pinned[:n].tolist()  # expect: FC101
        finish = getattr(self, f"_finish_{s.score_mode}")
        out = finish(reqs, vals)
        crit = [r for r in reqs if r.critique]
        if crit:
            self._run_critiques(crit)
        return out

    def _finish_scalar(self, reqs: List[ScoreRequest], vals: List[float]) -> Dict[str, float]:
        return {r.rid: v for r, v in zip(reqs, vals)}

    def _finish_pairwise(self, reqs: List[ScoreRequest], vals: List[float]) -> Dict[str, float]:
        by_pair: Dict[str, List[Tuple[str, float]]] = collections.defaultdict(list)
        for r, v in zip(reqs, vals):
            by_pair[r.pair_id or r.rid].append((r.rid, v))
        out: Dict[str, float] = {}
        for members in by_pair.values():
            mean = sum(v for _, v in members) / len(members)
            out.update({rid: v - mean for rid, v in members})
        return out

    def _run_critiques(self, reqs: List[ScoreRequest]) -> None:
        rids = [r.rid for r in reqs]
        first = self.critique.prefill_template(rids)
        toks = self.critique.decode_tokens(CritiqueBatch(request_ids=rids, prefix_ids=rids), first)
        ev = torch.cuda.Event()
        ev.record()
        for rid in rids:
            self.kv_pool.release(rid)
        self._publish_q.put((ev, rids, len(toks)))

    def _publish_loop(self) -> None:
        """Output thread: waits for the GPU off the serving thread and publishes critiques."""
        while True:
            ev, rids, n = self._publish_q.get()
            ev.synchronize()  # ok: FC101
            logger.info("published %d critiques (%s...)", n, rids[:3])
