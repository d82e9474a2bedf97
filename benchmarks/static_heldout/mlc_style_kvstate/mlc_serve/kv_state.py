"""A paged KV cache state object in the style of MLC's PagedKVCache: sequences are added, forked and popped,
and every forward is bracketed by begin_forward (aux arrays + plan) and end_forward (lengths advance)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache, xqa_batch_decode_with_kv_cache

from mlc_serve.attn_dispatch import DecodeBackend, ForwardKind, run_planner


@dataclass
class KVCacheConfig:
    num_layers: int
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int = 16
    num_pages: int = 8192
    max_batch_size: int = 128
    max_pages_per_seq: int = 512
    max_tree_size: int = 64
    prefill_workspace_bytes: int = 256 << 20
    decode_backend: DecodeBackend = DecodeBackend.FA2


@dataclass
class SequenceState:
    seq_id: int
    pages: List[int] = field(default_factory=list)
    length: int = 0
    parent: Optional[int] = None

    def last_page_len_after(self, extra: int, page_size: int) -> int:
        total = self.length + extra
        return total - (math.ceil(total / page_size) - 1) * page_size if total else 0


class PagedKVCache:
    WORKSPACE_MB = 128

    def __init__(self, cfg: KVCacheConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.page_size = cfg.page_size
        self.pages = torch.zeros(
            (cfg.num_layers, cfg.num_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim), dtype=torch.float16, device=device
        )
        self.ref_count = np.zeros(cfg.num_pages, dtype=np.int32)
        self.free_pages: List[int] = list(range(cfg.num_pages - 1, 0, -1))  # page 0 is the dummy page of padded rows
        self.seqs: Dict[int, SequenceState] = {}
        self.plan_seconds = 0.0

        max_bs, max_pages = cfg.max_batch_size, cfg.max_batch_size * cfg.max_pages_per_seq
        self.qo_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.page_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.page_indices_host = torch.zeros(max_pages, dtype=torch.int32, pin_memory=True)
        self.last_page_len_host = torch.zeros(max_bs, dtype=torch.int32, pin_memory=True)
        self.qo_indptr_gpu = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.page_indptr_gpu = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.page_indices_gpu = torch.zeros(max_pages, dtype=torch.int32, device=device)
        self.last_page_len_gpu = torch.zeros(max_bs, dtype=torch.int32, device=device)
        self.seq_lens_gpu = torch.zeros(max_bs, dtype=torch.int32, device=device)
        self.tree_mask_gpu = torch.zeros(max_bs * cfg.max_tree_size * cfg.max_tree_size, dtype=torch.bool, device=device)

        self.decode_workspace = torch.empty(self.WORKSPACE_MB << 20, dtype=torch.uint8, device=device)  # expect: FC106
        self.prefill_workspace = torch.empty(cfg.prefill_workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.decode_workspace, "NHD")
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, "NHD")
        self.verify_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, "NHD")
        self.graph_decode_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self._plan_info: Dict[ForwardKind, Tuple[int, int]] = {}  # ok: FC103

        if cfg.decode_backend is DecodeBackend.TRTLLM_GEN:
            self.trtllm_workspace = torch.empty(max_bs * cfg.num_qo_heads * cfg.head_dim * 64, dtype=torch.uint8, device=device)  # expect: FC105
        elif cfg.decode_backend is DecodeBackend.XQA:
            xqa_ws = torch.empty(max_bs * cfg.num_qo_heads * 4096, dtype=torch.uint8, device=device)  # ok: FC105
            xqa_ws.zero_()
            self.xqa_workspace = xqa_ws
        self.block_tables = torch.zeros((max_bs, cfg.max_pages_per_seq), dtype=torch.int32, device=device)

        self.cur_kind = ForwardKind.DECODE
        self.cur_seq_ids: List[int] = []
        self.cur_append_lengths: List[int] = []
        self.cur_batch_size = 0

    # ---- sequences ---------------------------------------------------------------------------------------

    def add_sequence(self, seq_id: int) -> None:
        assert seq_id not in self.seqs, f"sequence {seq_id} already exists"  # expect: FC109
        self.seqs[seq_id] = SequenceState(seq_id)

    def remove_sequence(self, seq_id: int) -> None:
        self._release(self.seqs.pop(seq_id).pages)
        self._check_page_accounting()

    def fork_sequence(self, parent_id: int, child_id: int, fork_pos: int = -1) -> None:
        if parent_id not in self.seqs or child_id in self.seqs:
            raise KeyError(f"cannot fork {parent_id} -> {child_id}")
        parent = self.seqs[parent_id]
        pos = parent.length if fork_pos < 0 else fork_pos
        full, rem = divmod(pos, self.page_size)
        child = SequenceState(child_id, pages=list(parent.pages[:full]), length=pos, parent=parent_id)
        self.ref_count[child.pages] += 1
        if rem:
            page = self._alloc_page()
            self.pages[:, page].copy_(self.pages[:, parent.pages[full]])
            child.pages.append(page)
        self.seqs[child_id] = child

    def popn(self, seq_id: int, n: int) -> None:
        """Roll back the last `n` tokens (rejected speculative tokens)."""
        seq = self.seqs[seq_id]
        if n > seq.length:
            raise ValueError(f"popn({seq_id}, {n}) on a sequence of length {seq.length}")
        seq.length -= n
        keep = math.ceil(seq.length / self.page_size)
        self._release(seq.pages[keep:])
        del seq.pages[keep:]
        if seq_id in self.cur_seq_ids:
            slot = self.cur_seq_ids.index(seq_id)
            # keep the decode graph's view in step with the rollback
            self.last_page_len_gpu[slot] = seq.last_page_len_after(0, self.page_size)  # expect: FC104

    def _alloc_page(self) -> int:
        page = self.free_pages.pop()
        self.ref_count[page] = 1
        return page

    def _release(self, pages: Sequence[int]) -> None:
        for p in pages:
            self.ref_count[p] -= 1
            if self.ref_count[p] == 0:
                self.free_pages.append(p)

    def _check_page_accounting(self) -> None:
        in_use = int((self.ref_count > 0).sum())
        assert in_use + len(self.free_pages) == self.cfg.num_pages - 1, (in_use, len(self.free_pages))  # ok: FC109

    # ---- forward bracket ---------------------------------------------------------------------------------

    def note_plan(self, kind: ForwardKind, n: int) -> None:
        self._plan_info[kind] = (n, int(self.page_indptr_host[n]))

    def begin_forward(self, seq_ids: Sequence[int], append_lengths: Sequence[int], kind: Optional[ForwardKind] = None, pad_to: int = 0) -> None:
        if kind is None:
            kind = ForwardKind.DECODE if all(a == 1 for a in append_lengths) else ForwardKind.PREFILL
        self.cur_kind, self.cur_seq_ids, self.cur_append_lengths = kind, list(seq_ids), list(append_lengths)
        n = len(seq_ids)
        rows = max(n, pad_to)
        qo = np.zeros(rows + 1, dtype=np.int32)
        np.cumsum(list(append_lengths) + [1] * (rows - n), out=qo[1:])
        indptr, indices, last = [0], [], []
        for sid, extra in zip(seq_ids, append_lengths):
            seq = self.seqs[sid]
            while len(seq.pages) * self.page_size < seq.length + extra:
                seq.pages.append(self._alloc_page())
            indices.extend(seq.pages)
            indptr.append(len(indices))
            last.append(seq.last_page_len_after(extra, self.page_size))
        for _ in range(rows - n):  # padded rows read the dummy page 0
            indices.append(0)
            indptr.append(len(indices))
            last.append(1)
        total = len(indices)
        if total > self.page_indices_host.numel():
            self.page_indices_host = torch.zeros(2 * total, dtype=torch.int32, pin_memory=True)  # ok: FC107
        if total > self.page_indices_gpu.numel():
            self.page_indices_gpu = torch.cat([self.page_indices_gpu, self.page_indices_gpu.new_zeros(total)])  # expect: FC107
        self.qo_indptr_host[: rows + 1] = torch.from_numpy(qo)
        self.page_indptr_host[: rows + 1] = torch.tensor(indptr, dtype=torch.int32)
        self.page_indices_host[:total] = torch.tensor(indices, dtype=torch.int32)
        self.last_page_len_host[:rows] = torch.tensor(last, dtype=torch.int32)
        self.cur_batch_size = rows
        self.sync_aux_to_device(rows, total)
        run_planner(kind, self, rows)

    def sync_aux_to_device(self, rows: int, total: int) -> None:
        self.qo_indptr_gpu[: rows + 1].copy_(self.qo_indptr_host[: rows + 1], non_blocking=True)
        self.page_indptr_gpu[: rows + 1].copy_(self.page_indptr_host[: rows + 1], non_blocking=True)  # ok: FC104
        self.page_indices_gpu[:total].copy_(self.page_indices_host[:total], non_blocking=True)
        self.last_page_len_gpu[:rows].copy_(self.last_page_len_host[:rows], non_blocking=True)
        if self.cfg.decode_backend is not DecodeBackend.FA2:
            lens = (self.page_indptr_gpu[1 : rows + 1] - self.page_indptr_gpu[:rows] - 1) * self.page_size
            self.seq_lens_gpu[:rows] = lens + self.last_page_len_gpu[:rows]

    def end_forward(self) -> None:
        for sid, extra in zip(self.cur_seq_ids, self.cur_append_lengths):
            self.seqs[sid].length += extra

    # ---- attention ---------------------------------------------------------------------------------------

    def _append_kv(self, layer_id: int, k: torch.Tensor, v: torch.Tensor) -> None:
        torch.ops.mlc.append_paged_kv(self.pages[layer_id], k, v, self.qo_indptr_gpu, self.page_indptr_gpu, self.page_indices_gpu, self.last_page_len_gpu)

    def attention(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self._append_kv(layer_id, k, v)
        kv = self.pages[layer_id]
        match self.cur_kind:
            case ForwardKind.DECODE:
                return self._attn_decode(q, kv)
            case ForwardKind.SPEC_VERIFY:
                return self.verify_wrapper.run(q, kv)  # expect: FC108
            case _:
                return self.prefill_wrapper.run(q, kv)

    def _attn_decode(self, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        bs = self.cur_batch_size
        scale = self.cfg.head_dim**-0.5
        max_len = self.cfg.max_pages_per_seq * self.page_size
        match self.cfg.decode_backend:
            case DecodeBackend.TRTLLM_GEN:
                return trtllm_batch_decode_with_kv_cache(
                    query=q, kv_cache=kv, workspace_buffer=self.trtllm_workspace, block_tables=self.block_tables[:bs],
                    seq_lens=self.seq_lens_gpu[:bs], max_seq_len=max_len, bmm1_scale=scale, bmm2_scale=1.0,
                )
            case DecodeBackend.XQA:
                return xqa_batch_decode_with_kv_cache(
                    query=q, kv_cache=kv, workspace_buffer=self.xqa_workspace, block_tables=self.block_tables[:bs],
                    seq_lens=self.seq_lens_gpu[:bs], max_seq_len=max_len, bmm1_scale=scale, bmm2_scale=1.0,
                )
            case _:
                wrapper = self.graph_decode_wrappers.get(bs, self.decode_wrapper)
                return wrapper.run(q, kv)  # ok: FC108
