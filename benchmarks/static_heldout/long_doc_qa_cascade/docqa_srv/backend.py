"""Two-level cascade attention: level 0 is the shared document, level 1 the question + answer.

Graph-mode cascade wrappers (one per decode bucket) are bound to persistent per-level
buffers; prefill of new questions and oversize decode batches use the eager cascade.
"""

import logging
import os
from typing import Dict, List, Optional

import numpy as np
import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    MultiLevelCascadeAttentionWrapper,
    trtllm_batch_context_with_kv_cache,
)

from docqa import cascade_compat
from docqa.benchmarks_support.step_timer import step_timer
from docqa.config import QAConfig
from docqa_srv.forward_batch import CascadeLevels, ForwardBatch, group_by_document

logger = logging.getLogger(__name__)

_CTX_WS: Optional[torch.Tensor] = None


def get_context_workspace(nbytes: int, device) -> torch.Tensor:
    global _CTX_WS
    if _CTX_WS is None or _CTX_WS.numel() < nbytes:
        _CTX_WS = torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105
    return _CTX_WS


class DocQABackend:
    WORKSPACE_BYTES = 512 * 1024 * 1024

    def __init__(self, cfg: QAConfig, kv_cache: torch.Tensor, cite_kv: torch.Tensor, device):
        self.cfg = cfg
        self.device = device
        self.kv_cache = kv_cache
        self.cite_kv = cite_kv
        self.max_q_len = cfg.max_question_tokens
        max_bs = cfg.max_batch_size
        cascade_compat.install()

        self.graph_ws = torch.empty(self.WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.eager_ws = torch.empty(int(os.environ.get("DOCQA_EAGER_WS_BYTES", cfg.question_workspace_bytes())), dtype=torch.uint8, device=device)  # ok: FC106
        self.cite_ws = torch.empty(cfg.cite_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105

        # level 0 = document, level 1 = question + answer
        self.qo_indptr_bufs = [torch.zeros(max_bs + 1, dtype=torch.int32, device=device) for _ in range(2)]
        self.kv_indptr_bufs = [torch.zeros(max_bs + 1, dtype=torch.int32, device=device) for _ in range(2)]
        self.last_page_len_bufs = [torch.ones(max_bs, dtype=torch.int32, device=device) for _ in range(2)]
        self.doc_kv_indices = torch.zeros(cfg.max_doc_pages, dtype=torch.int32, device=device)
        self.unique_kv_indices = torch.zeros(cfg.max_unique_pages, dtype=torch.int32, device=device)
        self.qo_indptr_host = [torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True) for _ in range(2)]
        self.kv_indptr_host = [torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True) for _ in range(2)]
        self.last_page_len_host = [torch.ones(max_bs, dtype=torch.int32, pin_memory=True) for _ in range(2)]
        self.unique_scratch = torch.zeros(cfg.max_unique_pages, dtype=torch.int32, device=device)
        self.doc_ids_dev = torch.zeros(max_bs, dtype=torch.int32, device=device)

        self.graph_cascade: Dict[int, MultiLevelCascadeAttentionWrapper] = {}
        for bs in cfg.graph_batch_sizes:
            self.graph_cascade[bs] = MultiLevelCascadeAttentionWrapper(
                2,
                self.graph_ws,
                "NHD",
                use_cuda_graph=True,
                qo_indptr_buf_arr=[b[: bs + 1] for b in self.qo_indptr_bufs],
                paged_kv_indptr_buf_arr=[b[: bs + 1] for b in self.kv_indptr_bufs],
                paged_kv_indices_buf_arr=[self.doc_kv_indices, self.unique_kv_indices],
                paged_kv_last_page_len_buf_arr=[b[:bs] for b in self.last_page_len_bufs],
            )
        self.eager_cascade = MultiLevelCascadeAttentionWrapper(2, self.eager_ws, "NHD")
        self.cite_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.cite_ws, "NHD", backend="fa2")
        self.doc_pages: List[np.ndarray] = []
        self.doc_last = np.ones(cfg.max_docs, dtype=np.int32)
        self.graph_bs: Optional[int] = None

    # ------------------------------------------------------------ helpers
    def _build_levels(self, fb: ForwardBatch, bs: int, debug: bool) -> int:
        """Fill both levels' host mirrors; returns the number of level-0 index entries."""
        grouped = group_by_document(fb.doc_ids_np, self.doc_pages, self.doc_last, self.cfg.page_size)
        starts, doc_kv_indptr, doc_indices, doc_last = grouped
        ngroups = starts.shape[0] - 1
        self.qo_indptr_host[0][: ngroups + 1] = torch.from_numpy(starts)
        self.kv_indptr_host[0][: ngroups + 1] = torch.from_numpy(doc_kv_indptr)
        self.last_page_len_host[0][:ngroups] = torch.from_numpy(doc_last)
        q_per_req = np.ones(fb.batch_size, dtype=np.int32) if fb.is_decode else fb.question_lens_cpu.numpy()
        self.qo_indptr_host[1][: fb.batch_size + 1] = torch.from_numpy(np.concatenate([[0], np.cumsum(q_per_req)]))
        self.kv_indptr_host[1][: fb.batch_size + 1] = torch.from_numpy(fb.unique_indptr_np)
        self.last_page_len_host[1][: fb.batch_size] = torch.from_numpy(fb.question_last_page_len_np)
        for lvl in range(2):
            n = fb.batch_size
            self.qo_indptr_host[lvl][n + 1 : bs + 1] = self.qo_indptr_host[lvl][n]
            self.kv_indptr_host[lvl][n + 1 : bs + 1] = self.kv_indptr_host[lvl][n]
        if debug:
            logger.info("level-1 qo_indptr %s", self.qo_indptr_bufs[1][: bs + 1].tolist())  # ok: FC101
        self._doc_indices_np = doc_indices
        return int(doc_kv_indptr[-1])

    def _plan_graph(self, bs: int, fb: ForwardBatch) -> None:
        nnz0 = self._build_levels(fb, bs, debug=False)
        nnz1 = int(fb.unique_indptr_np[-1])
        for lvl in range(2):
            self.qo_indptr_bufs[lvl][: bs + 1].copy_(self.qo_indptr_host[lvl][: bs + 1], non_blocking=True)  # ok: FC104
        self.doc_kv_indices[:nnz0].copy_(torch.from_numpy(self._doc_indices_np), non_blocking=True)
        self.unique_kv_indices[:nnz1].copy_(fb.unique_kv_indices, non_blocking=True)
        self.graph_cascade[bs].plan(  # ok: FC102
            [self.qo_indptr_host[0][: bs + 1], self.qo_indptr_host[1][: bs + 1]],
            [self.kv_indptr_host[0][: bs + 1], self.kv_indptr_host[1][: bs + 1]],
            [self.doc_kv_indices[:nnz0], self.unique_kv_indices[:nnz1]],
            [self.last_page_len_host[0][:bs], self.last_page_len_host[1][:bs]],
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
        )

    # ------------------------------------------------------------ metadata roots
    @step_timer("metadata")
    def init_forward_metadata(self, fb: ForwardBatch) -> CascadeLevels:
        levels = CascadeLevels(fb.batch_size, fb.num_docs, self.device)
        if (fb.question_lens > self.max_q_len).any():  # expect: FC101
            raise ValueError("question longer than max_question_tokens")
        self.doc_ids_dev = torch.from_numpy(fb.doc_ids_np.astype(np.int32)).to(self.device)  # expect: FC107
        self.unique_scratch.resize_(int(fb.unique_indptr_np[-1]))  # expect: FC107
        if fb.total_question_tokens == 0 and fb.is_decode and self.graph_bs is not None:
            return levels
        nnz0 = self._build_levels(fb, fb.batch_size, debug=False)
        bs = fb.batch_size
        levels.doc_kv_indices = torch.from_numpy(self._doc_indices_np).to(self.device, non_blocking=True)
        self.eager_cascade.plan(  # expect: FC102
            [self.qo_indptr_host[0][: bs + 1], self.qo_indptr_host[1][: bs + 1]],
            [self.kv_indptr_host[0][: bs + 1], self.kv_indptr_host[1][: bs + 1]],
            [levels.doc_kv_indices[:nnz0], fb.unique_kv_indices],
            [self.last_page_len_host[0][:bs], fb.question_last_page_len],
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            causal=not fb.is_decode,
        )
        return levels

    def init_forward_metadata_capture_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        self.graph_bs = bs
        self._plan_graph(bs, fb)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        self.graph_bs = bs
        self._plan_graph(bs, fb)

    # ------------------------------------------------------------ attention
    def forward_decode(self, q: torch.Tensor, layer: int, fb: ForwardBatch) -> torch.Tensor:
        w = self.graph_cascade[self.graph_bs] if self.graph_bs is not None else self.eager_cascade
        o = w.run(q, self.kv_cache[layer])  # ok: FC108
        cite = self.cite_wrapper.run(q, self.cite_kv[layer])  # expect: FC108
        return o + 0.1 * cite

    def forward_question_prefill(self, q: torch.Tensor, layer: int, fb: ForwardBatch, block_tables, kv_lens) -> torch.Tensor:
        if not self.cfg.use_trtllm_prefill:
            return self.eager_cascade.run(q, self.kv_cache[layer])
        ws = get_context_workspace(self.cfg.question_workspace_bytes(), self.device)
        cum_q = self.qo_indptr_bufs[1][: fb.batch_size + 1]
        return trtllm_batch_context_with_kv_cache(
            query=q,
            kv_cache=self.kv_cache[layer],
            workspace_buffer=ws,
            block_tables=block_tables,
            seq_lens=kv_lens,
            max_q_len=self.max_q_len,
            max_kv_len=self.cfg.max_doc_tokens + self.max_q_len,
            bmm1_scale=self.cfg.head_dim ** -0.5,
            bmm2_scale=1.0,
            batch_size=fb.batch_size,
            cum_seq_lens_q=cum_q,
            cum_seq_lens_kv=self.kv_indptr_bufs[1][: fb.batch_size + 1],
        )
