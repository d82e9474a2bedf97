"""Decoder attention: causal self-attention over the answer so far, cross-attention over every passage.

Each request's passages are one page list (all its passages' pages back to back), so cross-attention
is a paged decode over that list.  One pair of graph-mode wrappers (self, cross) per bucket; a summary
wrapper attends to each passage's first page (its title and lead) and is merged into the cross output.
"""

import itertools
from dataclasses import dataclass
from typing import Dict

import flashinfer
import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from fidrag.config import FiDConfig
from fidrag.workspace import make_workspace


@dataclass
class DecodeBatch:
    bs: int
    input_ids: torch.Tensor
    cross_indptr_np: np.ndarray
    cross_indices_np: np.ndarray
    cross_last_np: np.ndarray
    cross_indptr_dev: torch.Tensor
    self_indptr_np: np.ndarray
    self_indices_np: np.ndarray
    self_last_np: np.ndarray
    summary_indptr_np: np.ndarray
    summary_indices_np: np.ndarray
    cache_hit_np: np.ndarray
    passage_scores: torch.Tensor  # [bs, passages_per_query], retriever scores on the device


def _fill_host(indptr_h: torch.Tensor, indices_h: torch.Tensor, last_h: torch.Tensor,
               indptr_np: np.ndarray, indices_np: np.ndarray, last_np: np.ndarray, n: int, bs: int) -> int:
    indptr_h[: n + 1] = torch.from_numpy(indptr_np.astype(np.int32))
    indptr_h[n + 1 : bs + 1] = int(indptr_np[-1])
    total = int(indptr_np[-1])
    indices_h[:total] = torch.from_numpy(indices_np.astype(np.int32))
    last_h[:n] = torch.from_numpy(last_np.astype(np.int32))
    last_h[n:bs] = 1
    return total


class CrossAttnBackend:
    def __init__(self, cfg: FiDConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        max_bs = cfg.max_batch
        n_cross = max_bs * cfg.max_cross_pages_per_req
        n_self = max_bs * cfg.max_self_pages_per_req
        self.workspace = make_workspace(cfg.cross_workspace_bytes(), self.device)
        self.long_workspace = make_workspace(cfg.long_workspace_bytes(), self.device)

        self.cross_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.cross_indices = torch.zeros(n_cross, dtype=torch.int32, device=self.device)
        self.cross_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        self.self_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.self_indices = torch.zeros(n_self, dtype=torch.int32, device=self.device)
        self.self_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=self.device)

        self.cross_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.cross_indices_host = torch.zeros(n_cross, dtype=torch.int32, pin_memory=True)
        self.cross_last_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.self_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.self_indices_host = torch.zeros(n_self, dtype=torch.int32, pin_memory=True)
        self.self_last_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)

        self.cross_graph: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.self_graph: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.cross_eager = BatchDecodeWithPagedKVCacheWrapper(self.workspace, "NHD", backend="fa2")
        self.self_eager = BatchDecodeWithPagedKVCacheWrapper(self.workspace, "NHD", backend="fa2")
        self.summary_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.workspace, "NHD", backend="fa2")

        self.req_ids = torch.arange(max_bs, dtype=torch.int32, device=self.device)
        self.page_stamp = torch.zeros(cfg.cross_pool_pages, dtype=torch.int32, device=self.device)
        self.rerank_scores = None
        self.hit_rate = 0.0
        self.step_counter = 0

    def _heads(self):
        c = self.cfg
        return dict(
            num_qo_heads=c.num_qo_heads,
            num_kv_heads=c.num_kv_heads,
            head_dim=c.head_dim,
            page_size=c.page_size,
            q_data_type=torch.bfloat16,
        )

    def _summary_args(self, indptr_np: np.ndarray, indices_np: np.ndarray, bs: int):
        indptr = torch.from_numpy(indptr_np.astype(np.int32))
        indices = torch.from_numpy(indices_np.astype(np.int32))
        return indptr, indices, torch.full((bs,), self.cfg.page_size, dtype=torch.int32)

    # ---- capture ----------------------------------------------------------------------------------
    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        self.cross_graph[bs] = BatchDecodeWithPagedKVCacheWrapper(
            self.workspace,
            "NHD",
            use_cuda_graph=True,
            paged_kv_indptr_buffer=self.cross_indptr[: bs + 1],
            paged_kv_indices_buffer=self.cross_indices,
            paged_kv_last_page_len_buffer=self.cross_last_page_len[:bs],
            backend="fa2",
        )
        self.self_graph[bs] = BatchDecodeWithPagedKVCacheWrapper(
            self.workspace,
            "NHD",
            use_cuda_graph=True,
            paged_kv_indptr_buffer=self.self_indptr[: bs + 1],
            paged_kv_indices_buffer=self.self_indices,
            paged_kv_last_page_len_buffer=self.self_last_page_len[:bs],
            backend="fa2",
        )
        self.cross_last_page_len[:bs].fill_(1)  # ok: FC104
        one_page = torch.arange(bs + 1, dtype=torch.int32)
        zeros = torch.zeros(bs, dtype=torch.int32)
        ones = torch.ones(bs, dtype=torch.int32)
        self.cross_graph[bs].plan(one_page, zeros, ones, **self._heads())
        self.self_graph[bs].plan(one_page, zeros, ones, **self._heads())
        self.summary_wrapper.plan(one_page, zeros, ones, **self._heads())

    def check_layouts(self) -> None:
        for w in itertools.chain(self.cross_graph.values(), self.self_graph.values()):
            if w._kv_layout != "NHD":  # expect: FC103
                raise RuntimeError("cross and self graphs must share the NHD page layout")

    # ---- per step -----------------------------------------------------------------------------------
    def init_forward_metadata_replay_cuda_graph(self, bs: int, batch: DecodeBatch) -> None:
        n = batch.bs
        c_total = _fill_host(self.cross_indptr_host, self.cross_indices_host, self.cross_last_host,
                             batch.cross_indptr_np, batch.cross_indices_np, batch.cross_last_np, n, bs)
        s_total = _fill_host(self.self_indptr_host, self.self_indices_host, self.self_last_host,
                             batch.self_indptr_np, batch.self_indices_np, batch.self_last_np, n, bs)
        self.cross_indptr[: bs + 1].copy_(self.cross_indptr_host[: bs + 1], non_blocking=True)  # ok: FC104
        self.cross_indices[:c_total].copy_(self.cross_indices_host[:c_total], non_blocking=True)
        self.cross_last_page_len[:bs].copy_(self.cross_last_host[:bs], non_blocking=True)
        self.self_indptr[: bs + 1].copy_(self.self_indptr_host[: bs + 1], non_blocking=True)
        self.self_indices[:s_total].copy_(self.self_indices_host[:s_total], non_blocking=True)
        self.self_last_page_len[:bs].copy_(self.self_last_host[:bs], non_blocking=True)

        self.cross_graph[bs].plan(  # ok: FC102
            self.cross_indptr_host[: bs + 1],
            self.cross_indices_host[:c_total],
            self.cross_last_host[:bs],
            **self._heads(),
        )
        self.self_graph[bs].plan(
            self.self_indptr_host[: bs + 1],
            self.self_indices_host[:s_total],
            self.self_last_host[:bs],
            **self._heads(),
        )
        self.summary_wrapper.plan(*self._summary_args(batch.summary_indptr_np, batch.summary_indices_np, n), **self._heads())

        # this step's KV write appends the new token to the answer's last page
        self.self_last_page_len[:n].add_(1)  # expect: FC104
        live_pages = self.cross_indices[: self.cross_indptr[bs]]  # expect: FC101
        self.step_counter += 1
        self.page_stamp.index_fill_(0, live_pages.long(), self.step_counter)
        self.cross_indptr_host[bs + 1 :].fill_(c_total)  # ok: FC104

    def init_forward_metadata(self, batch: DecodeBatch) -> None:
        """Eager step for batch sizes without a graph."""
        n = batch.bs
        per_req = self.cfg.passages_per_query
        reused = [i for i in range(n * per_req) if batch.cache_hit_np[i]]  # ok: FC101
        self.hit_rate = len(reused) / max(1, n * per_req)
        self.cross_eager.plan(  # expect: FC102
            batch.cross_indptr_dev,
            torch.from_numpy(batch.cross_indices_np.astype(np.int32)).to(self.device),
            torch.from_numpy(batch.cross_last_np.astype(np.int32)),
            **self._heads(),
        )
        self_indptr = torch.tensor(batch.self_indptr_np, dtype=torch.int32)
        self.self_eager.plan(  # ok: FC102
            self_indptr,
            torch.from_numpy(batch.self_indices_np.astype(np.int32)),
            torch.from_numpy(batch.self_last_np.astype(np.int32)),
            **self._heads(),
        )
        self.summary_wrapper.plan(*self._summary_args(batch.summary_indptr_np, batch.summary_indices_np, n), **self._heads())
        req_of_passage = torch.repeat_interleave(self.req_ids[:n], per_req)  # ok: FC101
        buf = self.rerank_scores
        if buf is None:
            self.rerank_scores = torch.empty(self.cfg.max_batch * per_req, dtype=torch.float32, device=self.device)  # ok: FC107
        self.rerank_scores[: req_of_passage.numel()].copy_(batch.passage_scores.flatten())

    # ---- kernels -----------------------------------------------------------------------------------------
    def forward_decode_graph(self, q: torch.Tensor, self_kv: torch.Tensor, cross_kv: torch.Tensor, bs: int):
        o_self = self.self_graph[bs].run(q, self_kv)  # ok: FC108
        o_cross, lse_cross = self.cross_graph[bs].run(q, cross_kv, return_lse=True)
        o_sum, lse_sum = self.summary_wrapper.run(q, cross_kv, return_lse=True)  # expect: FC108
        fused, _ = flashinfer.merge_state(o_cross, lse_cross, o_sum, lse_sum)
        return o_self, fused

    def forward_decode_eager(self, q: torch.Tensor, self_kv: torch.Tensor, cross_kv: torch.Tensor):
        o_self = self.self_eager.run(q, self_kv)
        o_cross, lse_cross = self.cross_eager.run(q, cross_kv, return_lse=True)
        o_sum, lse_sum = self.summary_wrapper.run(q, cross_kv, return_lse=True)
        fused, _ = flashinfer.merge_state(o_cross, lse_cross, o_sum, lse_sum)
        return o_self, fused

    def forward_cross_long(self, q, cross_kv, block_tables: torch.Tensor, seq_lens: torch.Tensor, max_len: int):
        return trtllm_batch_decode_with_kv_cache(
            q,
            cross_kv,
            self.long_workspace,
            block_tables,
            seq_lens,
            max_len,
            bmm1_scale=self.cfg.head_dim ** -0.5,
            bmm2_scale=1.0,
        )

    def relocate_passage(self, positions: torch.Tensor, new_pages: torch.Tensor) -> None:
        """A cached passage was re-encoded into new pages: point the live page lists at them."""
        self.cross_indices[positions] = new_pages  # expect: FC104
        self.cross_indices_host[positions.cpu()] = new_pages.cpu()
