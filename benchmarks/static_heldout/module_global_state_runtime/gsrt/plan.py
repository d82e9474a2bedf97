"""Plan functions: copy the host page table into the device globals and plan the wrappers.

Every function here reads gsrt.state (``S``) and gsrt.wrappers (``W``); nothing is passed around but
batch sizes and row numbers.
"""
import logging

import numpy as np
import torch

from . import config as C
from . import state as S
from . import wrappers as W

logger = logging.getLogger(__name__)

_prefill_plan = None  # bound plan() of the ragged prefill wrapper, set by init_plan_fns()
_memo = None


class _PlanMemo:
    """What the last eager plans were made for (shown by the admin report)."""

    def __init__(self):
        self._plan_info = {}
        self.count = 0

    def record(self, kind, key):
        self._plan_info[kind] = key  # ok: FC103
        self.count += 1

    def snapshot(self):
        return dict(self._plan_info), self.count


def init_plan_fns():
    """Bind the plan callables once the wrappers exist (engine.setup)."""
    global _prefill_plan, _memo
    _prefill_plan = W.prefill_wrapper.plan
    _memo = _PlanMemo()


def plan_decode(bs):
    """Eager decode plan for a batch size no graph was captured for."""
    assert S.kv_indptr is not None, "state.init_buffers() has not run"  # ok: FC109
    S.kv_indptr[: bs + 1].copy_(S.kv_indptr_cpu[: bs + 1], non_blocking=True)
    nnz = S.kv_indptr[bs].item()  # expect: FC101
    if nnz > S.max_pages:
        raise RuntimeError(f"kv_indptr {S.kv_indptr[: bs + 1]} runs past the page pool of {S.max_pages}")  # ok: FC101
    S.ensure_device_capacity(nnz)
    S.kv_indices[:nnz].copy_(S.kv_indices_cpu[:nnz], non_blocking=True)
    S.kv_last_page_len[:bs].copy_(S.kv_last_page_len_cpu[:bs], non_blocking=True)
    W.decode_wrapper.plan(  # expect: FC102
        S.kv_indptr[: bs + 1],
        S.kv_indices[:nnz],
        S.kv_last_page_len_cpu[:bs],
        C.NUM_Q_HEADS,
        C.NUM_KV_HEADS,
        C.HEAD_DIM,
        C.PAGE_SIZE,
        q_data_type=S.DTYPE,
        kv_data_type=S.DTYPE,
    )
    _memo.record("decode", (bs, nnz))


def _gather_window_indices(bs, kept, n_keep):
    """swa_kv_indices <- the last ``kept[i]`` pages of every row, gathered on the device."""
    rows = torch.arange(bs, device=S.DEVICE)
    row_of = torch.repeat_interleave(rows, kept, output_size=n_keep)  # ok: FC101
    first = S.swa_kv_indptr[:bs].long()[row_of]
    offs = torch.arange(n_keep, device=S.DEVICE) - first
    src = (S.kv_indptr[1 : bs + 1].long() - kept.long())[row_of] + offs
    S.swa_kv_indices[:n_keep] = S.kv_indices[src]


def plan_swa(bs):
    """Sliding-window decode plan: keep the last ceil(window / page) pages of every row."""
    win_pages = -(-C.SWA_WINDOW // C.PAGE_SIZE)
    kept_np = np.minimum(np.diff(S.kv_indptr_np[: bs + 1]), win_pages)
    n_keep = int(kept_np.sum())
    kept = torch.clamp(S.kv_indptr[1 : bs + 1] - S.kv_indptr[:bs], max=win_pages)
    S.swa_kv_indptr[0] = 0
    torch.cumsum(kept, 0, dtype=torch.int32, out=S.swa_kv_indptr[1 : bs + 1])
    _gather_window_indices(bs, kept, n_keep)
    kw = dict(
        indptr=S.swa_kv_indptr[: bs + 1],
        indices=S.swa_kv_indices[:n_keep],
        last_page_len=S.kv_last_page_len_cpu[:bs],
        num_qo_heads=C.NUM_Q_HEADS,
        num_kv_heads=C.NUM_KV_HEADS,
        head_dim=C.HEAD_DIM,
        page_size=C.PAGE_SIZE,
        window_left=C.SWA_WINDOW - 1,
        q_data_type=S.DTYPE,
        kv_data_type=S.DTYPE,
    )
    W.swa_decode_wrapper.plan(**kw)  # expect: FC102


def plan_long(bs):
    """trtllm-gen decode plan for the long-context layers (HND cache)."""
    nnz = int(S.kv_indptr_np[bs])
    W.long_decode_wrapper.plan(  # ok: FC102
        torch.from_numpy(S.kv_indptr_np[: bs + 1]),
        S.kv_indices[:nnz],
        torch.from_numpy(S.kv_last_page_len_np[:bs]),
        C.NUM_Q_HEADS,
        C.NUM_KV_HEADS,
        C.HEAD_DIM,
        C.PAGE_SIZE,
        q_data_type=S.DTYPE,
        kv_data_type=S.DTYPE,
    )


def plan_cascade(bs):
    """Two-level cascade: the shared system-prompt pages, then every row's own pages."""
    n_sfx = int(S.sfx_kv_indptr_np[bs])
    S.sfx_kv_indices[:n_sfx].copy_(S.sfx_kv_indices_cpu[:n_sfx], non_blocking=True)
    W.cascade_wrapper.plan(  # ok: FC102
        [torch.tensor([0, bs], dtype=torch.int32), S.qo_indptr_cpu[: bs + 1]],
        [S.prefix_kv_indptr_cpu, S.sfx_kv_indptr_cpu[: bs + 1]],
        [S.prefix_kv_indices[: S._STATE["shared_pages"]], S.sfx_kv_indices[:n_sfx]],
        [S.prefix_last_page_len_cpu, S.kv_last_page_len_cpu[:bs]],
        C.NUM_Q_HEADS,
        C.NUM_KV_HEADS,
        C.HEAD_DIM,
        C.PAGE_SIZE,
        q_data_type=S.DTYPE,
    )
    _memo.record("cascade", (bs, n_sfx))


def plan_chunk(row, n_extend):
    """Paged prefill plan for the prompt chunk that rides along a decode batch in row ``row``."""
    hi = int(S.kv_indptr_np[row + 1])
    S.kv_indptr[row + 1 : row + 2].copy_(S.kv_indptr_cpu[row + 1 : row + 2], non_blocking=True)
    S.kv_indices[:hi].copy_(S.kv_indices_cpu[:hi], non_blocking=True)
    S.kv_last_page_len[row : row + 1].copy_(S.kv_last_page_len_cpu[row : row + 1], non_blocking=True)
    indices = S.kv_indices[S.kv_indptr[row] : S.kv_indptr[row + 1]]  # expect: FC101
    W.chunk_wrapper.plan(
        torch.tensor([0, n_extend], dtype=torch.int32),
        S.kv_indptr_cpu[row : row + 2] - S.kv_indptr_cpu[row],
        indices,
        S.kv_last_page_len_cpu[row : row + 1],
        C.NUM_Q_HEADS,
        C.NUM_KV_HEADS,
        C.HEAD_DIM,
        C.PAGE_SIZE,
        causal=True,
        q_data_type=S.DTYPE,
    )
    _memo.record("chunk", (row, n_extend))


def plan_prefill(bs, num_tokens):
    """Ragged prefill plan over the new tokens of a prefill batch; the page table is uploaded for the
    KV append."""
    nnz = int(S.kv_indptr_np[bs])
    S.ensure_device_capacity(nnz)
    S.kv_indptr[: bs + 1].copy_(S.kv_indptr_cpu[: bs + 1], non_blocking=True)
    S.kv_indices[:nnz].copy_(S.kv_indices_cpu[:nnz], non_blocking=True)
    S.kv_last_page_len[:bs].copy_(S.kv_last_page_len_cpu[:bs], non_blocking=True)
    S.qo_indptr[: bs + 1].copy_(S.qo_indptr_cpu[: bs + 1], non_blocking=True)
    _prefill_plan(  # expect: FC102
        S.qo_indptr[: bs + 1],
        S.qo_indptr_cpu[: bs + 1],
        C.NUM_Q_HEADS,
        C.NUM_KV_HEADS,
        C.HEAD_DIM,
        causal=True,
        q_data_type=S.DTYPE,
    )
    _memo.record("prefill", (bs, num_tokens))


def plan_long_prefill(bs):
    """trtllm-gen paged prefill plan for the long-context layers of a prefill batch."""
    nnz = int(S.kv_indptr_np[bs])
    W.long_prefill_wrapper.plan(
        S.qo_indptr_cpu[: bs + 1],
        S.kv_indptr_cpu[: bs + 1],
        S.kv_indices[:nnz],
        S.kv_last_page_len_cpu[:bs],
        C.NUM_Q_HEADS,
        C.NUM_KV_HEADS,
        C.HEAD_DIM,
        C.PAGE_SIZE,
        causal=True,
        q_data_type=S.DTYPE,
        kv_data_type=S.DTYPE,
    )


def memo_snapshot():
    return _memo.snapshot() if _memo is not None else ({}, 0)
