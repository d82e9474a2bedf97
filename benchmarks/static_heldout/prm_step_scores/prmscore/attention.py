from __future__ import annotations

import logging
from typing import Dict, Optional

import torch
from flashinfer import (
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
)

from prmscore.batch import QuestionEntry, ScoreBatch
from prmscore.config import SCORE_WS_BYTES, ScoreConfig

logger = logging.getLogger(__name__)


class PrmAttnBackend:
    """Candidates attend to [shared question pages | own pages]; step tags refine among themselves."""

    def __init__(self, cfg: ScoreConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.graph_key: Optional[int] = None

        self.workspace = torch.empty(SCORE_WS_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.graph_workspace = torch.zeros(cfg.workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        refine_ws_bytes = cfg.max_num_tokens * cfg.num_qo_heads * (cfg.head_dim + 1) * 4 * 2
        self.refine_workspace = torch.empty(refine_ws_bytes, dtype=torch.uint8, device=device)  # ok: FC105

        self.eager_prefill = BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD")
        self.question_prefill = BatchPrefillWithRaggedKVCacheWrapper(self.workspace, "NHD")
        self.ragged_refine = BatchPrefillWithRaggedKVCacheWrapper(self.refine_workspace, "NHD", backend="fa3")

        max_c = cfg.graph_max_cands
        self.qo_indptr_buf = torch.zeros(max_c + 1, dtype=torch.int32, device=device)
        self.kv_indptr_buf = torch.zeros(max_c + 1, dtype=torch.int32, device=device)
        self.kv_indices_buf = torch.zeros(cfg.max_pages, dtype=torch.int32, device=device)
        self.kv_last_page_len_buf = torch.ones(max_c, dtype=torch.int32, device=device)
        self.graph_wrappers: Dict[int, BatchPrefillWithPagedKVCacheWrapper] = {}

    def init_graph_wrapper(self, num_tokens: int) -> BatchPrefillWithPagedKVCacheWrapper:
        max_c = self.cfg.graph_max_cands
        w = BatchPrefillWithPagedKVCacheWrapper(
            self.graph_workspace,
            "NHD",
            use_cuda_graph=True,
            qo_indptr_buf=self.qo_indptr_buf,
            paged_kv_indptr_buf=self.kv_indptr_buf,
            paged_kv_indices_buf=self.kv_indices_buf,
            paged_kv_last_page_len_buf=self.kv_last_page_len_buf,
        )
        self.graph_wrappers[num_tokens] = w
        return w

    # ---- question prefill (once per question, eager) ------------------------------------------
    def plan_question(self, q: QuestionEntry, qo_indptr_cpu: torch.Tensor) -> None:
        self.question_prefill.plan(qo_indptr_cpu, qo_indptr_cpu,  # ok: FC102
                                   self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim, causal=True)

    # ---- candidates ---------------------------------------------------------------------------
    def init_forward_metadata(self, batch: ScoreBatch) -> None:
        self.graph_key = None
        self.eager_prefill.plan(batch.qo_indptr_cpu, batch.kv_indptr_cpu, batch.kv_indices,  # ok: FC102
                                batch.last_page_len_cpu, self.cfg.num_qo_heads, self.cfg.num_kv_heads,
                                self.cfg.head_dim, self.cfg.page_size, causal=True)
        self._plan_refine(batch.step_seg_indptr_cpu)

    def _plan_refine(self, seg_indptr_cpu: Optional[torch.Tensor]) -> None:
        if seg_indptr_cpu is None:
            return
        self.ragged_refine.plan(seg_indptr_cpu, seg_indptr_cpu, self.cfg.num_qo_heads,
                                self.cfg.num_kv_heads, self.cfg.head_dim, causal=False)

    def init_forward_metadata_capture_cuda_graph(self, num_tokens: int, num_cands: int,
                                                 qo_indptr_cpu: torch.Tensor, kv_indptr_cpu: torch.Tensor,
                                                 last_cpu: torch.Tensor) -> None:
        self.graph_key = num_tokens
        self.graph_wrappers[num_tokens].plan(
            qo_indptr_cpu, kv_indptr_cpu, self.kv_indices_buf, last_cpu, self.cfg.num_qo_heads,
            self.cfg.num_kv_heads, self.cfg.head_dim, self.cfg.page_size, causal=True,
        )

    def init_forward_metadata_replay_cuda_graph(self, num_tokens: int, batch: ScoreBatch) -> None:
        self.graph_key = num_tokens
        n = batch.num_cands
        w = self.graph_wrappers[num_tokens]
        nnz = batch.kv_indices.shape[0]
        self.qo_indptr_buf[: n + 1].copy_(batch.qo_indptr_cpu, non_blocking=True)  # ok: FC104
        self.kv_indices_buf[:nnz].copy_(batch.kv_indices, non_blocking=True)  # ok: FC104
        w.plan(batch.qo_indptr_cpu, batch.kv_indptr_cpu, self.kv_indices_buf[:nnz], batch.last_page_len,  # expect: FC102
               self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim, self.cfg.page_size, causal=True)
        # padded candidate rows attend to one dummy page
        self.kv_last_page_len_buf[n:].fill_(1)  # expect: FC104

    # ---- forward ------------------------------------------------------------------------------
    def forward(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        if self.graph_key is None:
            w = self.eager_prefill
        else:
            w = self.graph_wrappers[self.graph_key]
        return w.run(q, kv_cache)  # ok: FC108

    def refine(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.ragged_refine.run(q, k, v)  # expect: FC108
