"""FlashInfer attention for batched expansions: one graph-mode decode wrapper per expansion width."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from mcts.config import SearchConfig

# extend (forced continuation) prefill budget
_PREFILL_WS_BYTES = lambda: 512 * 1024 * 1024  # noqa: E731


@dataclass
class ChildRow:
    pages: List[int]
    seq_len: int
    last_token: int


def snapshot_plan(wrapper) -> object:
    return wrapper._plan_info  # expect: FC103


def restore_plan(wrapper, saved) -> None:
    """Reuse a plan made for an identical page-table shape (same width, same page counts)."""
    wrapper._plan_info = saved  # expect: FC103


class ExpansionAttnBackend:
    def __init__(self, cfg: SearchConfig) -> None:
        self.cfg = cfg
        dev = torch.device(cfg.device)
        self.device = dev
        max_w = cfg.max_width
        self.graph_workspace = torch.zeros(cfg.decode_ws_bytes(), dtype=torch.uint8, device=dev)  # ok: FC106
        self.eager_ws = torch.empty(cfg.decode_ws_bytes(), dtype=torch.uint8, device=dev)  # expect: FC105
        self.prefill_workspace = torch.zeros(_PREFILL_WS_BYTES(), dtype=torch.uint8, device=dev)  # expect: FC106
        self.rollout_ws = torch.empty(cfg.decode_ws_bytes(), dtype=torch.uint8, device=dev)  # ok: FC105
        self.rollout_ws.zero_()

        self.eager_decode = BatchDecodeWithPagedKVCacheWrapper(self.eager_ws, "HND", **self._decode_kwargs())
        self.rollout_decode = BatchDecodeWithPagedKVCacheWrapper(self.graph_workspace, "HND", backend="fa2")
        self.prefill = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, "HND")
        self._plan_eager = functools.partial(
            self.eager_decode.plan,
            num_qo_heads=cfg.num_qo_heads,
            num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            page_size=cfg.page_size,
            q_data_type=torch.bfloat16,
        )

        max_pages = max_w * cfg.max_pages_per_row
        # bound to the graph wrappers of every width
        self.kv_indptr_buf = torch.zeros(max_w + 1, dtype=torch.int32, device=dev)
        self.kv_indices_buf = torch.zeros(max_pages, dtype=torch.int32, device=dev)
        self.last_page_len_buf = torch.ones(max_w, dtype=torch.int32, device=dev)
        self.child_lens = torch.zeros(max_w, dtype=torch.int32, device=dev)
        # host mirrors
        self.kv_indptr_cpu = torch.zeros(max_w + 1, dtype=torch.int32, pin_memory=True)
        self.kv_indices_cpu = torch.zeros(max_pages, dtype=torch.int32, pin_memory=True)
        self.last_page_len_cpu = torch.ones(max_w, dtype=torch.int32, pin_memory=True)
        self.child_lens_cpu = torch.zeros(max_w, dtype=torch.int32, pin_memory=True)
        # eager-width device copies and the extend inputs
        self.kv_indptr_dev = torch.zeros(max_w + 1, dtype=torch.int32, device=dev)
        self.last_page_len_dev = torch.ones(max_w, dtype=torch.int32, device=dev)
        self.qo_indptr_dev = torch.zeros(max_w + 1, dtype=torch.int32, device=dev)
        self.block_tables = torch.zeros(max_w, cfg.max_pages_per_row, dtype=torch.int32, device=dev)

        self.graph_decode: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self._saved_plans: Dict[Tuple[int, bytes], object] = {}

    def _decode_kwargs(self) -> dict:
        kw = {}
        if self.cfg.sm_major >= 10:
            kw["backend"] = "trtllm-gen"
        return kw

    def _plan_kwargs(self) -> dict:
        cfg = self.cfg
        return dict(num_qo_heads=cfg.num_qo_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                    page_size=cfg.page_size, q_data_type=torch.bfloat16)

    def bound_buffers(self) -> Tuple[torch.Tensor, ...]:
        return (self.kv_indptr_buf, self.kv_indices_buf, self.last_page_len_buf)

    def mirrors(self) -> Tuple[torch.Tensor, ...]:
        return (self.kv_indptr_cpu, self.kv_indices_cpu, self.last_page_len_cpu)

    def init_graph_wrappers(self) -> None:
        for w in self.cfg.expansion_widths:
            if w == 1:
                continue  # single-row rollouts use rollout_decode
            self.graph_decode[w] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace,
                "HND",
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.kv_indptr_buf[: w + 1],
                paged_kv_indices_buffer=self.kv_indices_buf,
                paged_kv_last_page_len_buffer=self.last_page_len_buf[:w],
                **self._decode_kwargs(),
            )

    # ------------------------------------------------------------ before replay
    def stage_width(self, w: int, rows: Sequence[ChildRow]) -> None:
        cfg = self.cfg
        n = len(rows)
        counts = np.zeros(w, dtype=np.int32)
        counts[:n] = [len(r.pages) for r in rows]
        indptr = np.zeros(w + 1, dtype=np.int32)
        np.cumsum(counts, out=indptr[1:])
        nnz = int(indptr[-1])
        self.kv_indptr_cpu[: w + 1] = torch.from_numpy(indptr)
        self.kv_indices_cpu[:nnz] = torch.from_numpy(np.fromiter((p for r in rows for p in r.pages), np.int32, nnz))
        lens = np.zeros(w, dtype=np.int32)
        lens[:n] = [r.seq_len for r in rows]
        self.child_lens_cpu[:w] = torch.from_numpy(lens)
        self.last_page_len_cpu[:w] = torch.from_numpy(np.maximum((lens - 1) % cfg.page_size + 1, 1))
        if int(self.child_lens_cpu[:w].max()) + cfg.tokens_per_expansion > cfg.max_seq_len:  # ok: FC101
            raise ValueError("an expansion would run past max_seq_len; prune the branch first")
        self.child_lens[:w].copy_(self.child_lens_cpu[:w], non_blocking=True)
        self.kv_indices_buf[:nnz].copy_(self.kv_indices_cpu[:nnz], non_blocking=True)  # ok: FC104
        wrapper = self.graph_decode.get(w)
        if wrapper is None:
            self.kv_indptr_dev[: w + 1].copy_(self.kv_indptr_cpu[: w + 1], non_blocking=True)
            self.last_page_len_dev[:w].copy_(self.last_page_len_cpu[:w], non_blocking=True)
            self._plan_eager(self.kv_indptr_dev[: w + 1], self.kv_indices_buf[:nnz], self.last_page_len_dev[:w])  # expect: FC102
            return
        key = (w, counts.tobytes())
        saved = self._saved_plans.get(key)
        if saved is not None:
            restore_plan(wrapper, saved)
            return
        wrapper.plan(  # ok: FC102
            self.kv_indptr_cpu[: w + 1],
            self.kv_indices_buf[:nnz],
            self.last_page_len_cpu[:w],
            **self._plan_kwargs(),
        )
        self._saved_plans[key] = snapshot_plan(wrapper)

    def plan_dummy(self, w: int) -> None:
        """One page per row, for the warm-up run before recording width ``w``."""
        self.kv_indptr_cpu[: w + 1] = torch.arange(w + 1, dtype=torch.int32)
        self.last_page_len_cpu[:w] = 1
        wrapper = self.graph_decode[w] if w > 1 else self.rollout_decode
        wrapper.plan(self.kv_indptr_cpu[: w + 1], self.kv_indices_buf[:w], self.last_page_len_cpu[:w], **self._plan_kwargs())

    def plan_extend(self, n: int, qo_lens: np.ndarray, kv_indptr_np: np.ndarray, last_np: np.ndarray, indices: torch.Tensor) -> None:
        """Forced continuation (e.g. a "wait, re-check" hint) appended to ``n`` children."""
        qo = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(qo_lens, out=qo[1:])
        self.qo_indptr_dev[: n + 1].copy_(torch.from_numpy(qo), non_blocking=True)
        kw = dict(
            qo_indptr=self.qo_indptr_dev[: n + 1],
            paged_kv_indptr=torch.from_numpy(kv_indptr_np),
            paged_kv_indices=indices,
            paged_kv_last_page_len=torch.from_numpy(last_np),
            num_qo_heads=self.cfg.num_qo_heads,
            num_kv_heads=self.cfg.num_kv_heads,
            head_dim_qk=self.cfg.head_dim,
            page_size=self.cfg.page_size,
            causal=True,
            q_data_type=torch.bfloat16,
        )
        self.prefill.plan(**kw)  # expect: FC102

    # ------------------------------------------------------------------ forward
    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, w: int) -> torch.Tensor:
        if w == 1:
            return self.rollout_decode.run(q, kv_cache)  # expect: FC108
        return self.graph_decode[w].run(q, kv_cache)  # ok: FC108

    def forward_extend(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.prefill.run(q, kv_cache)

    def rollout_trtllm(self, q: torch.Tensor, kv_cache: torch.Tensor, w: int, max_len: int) -> torch.Tensor:
        """Deep greedy rollouts on Blackwell, outside the graphs."""
        return trtllm_batch_decode_with_kv_cache(
            q, kv_cache, self.rollout_ws, self.block_tables[:w], self.child_lens[:w], max_len,
            bmm1_scale=self.cfg.head_dim ** -0.5, bmm2_scale=1.0,
        )
