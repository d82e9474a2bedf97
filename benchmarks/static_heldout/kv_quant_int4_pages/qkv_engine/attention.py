"""Decode attention over a quantized KV cache.

INT4 layers: every step, the pages of the batch are dequantized into a bf16
staging area (one staging slot per listed page) by a Triton kernel that reads
the per-page scales, and FlashInfer decodes over the staging pages.  The
captured graphs read ``kv_indptr`` / ``kv_indices`` / ``kv_last_page_len`` in
staging-slot space by address.

FP8 layers (a few accuracy-sensitive ones) read the pool directly, through an
FP8 decode wrapper or trtllm-gen's FP8 decode kernel on Blackwell.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
import triton
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    trtllm_batch_context_with_kv_cache,
    trtllm_batch_decode_with_kv_cache,
)

from qkv.config import FALLBACK_WORKSPACE_BYTES, MIN_PREFILL_WORKSPACE_BYTES, QuantKVConfig
from qkv.dequant import dequant_int4_pages_kernel, quantize_append_kernel
from qkv.scales import PageScaleTable
from qkv_engine.kv.page_pool import Int4PagePool

PAGES_PER_PROGRAM = 4


def _alloc_workspace(nbytes: int, device: torch.device, zeroed: bool = True) -> torch.Tensor:
    ws = torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105
    if zeroed:
        ws.zero_()
    return ws


@dataclasses.dataclass
class DecodeInputs:
    """Host view of one decode step, built by the scheduler with numpy."""

    rids: List[str]
    seq_lens_np: np.ndarray
    page_lists: List[List[int]]
    append_slots_np: np.ndarray

    @classmethod
    def dummy(cls, bs: int, page_size: int) -> "DecodeInputs":
        return cls(
            rids=[f"__dummy{i}" for i in range(bs)],
            seq_lens_np=np.ones(bs, dtype=np.int32),
            page_lists=[[i] for i in range(bs)],
            append_slots_np=np.arange(bs, dtype=np.int64) * page_size,
        )


class QuantDecodeAttention:
    def __init__(self, cfg: QuantKVConfig, pool: Int4PagePool, scales: PageScaleTable, device: torch.device):
        self.cfg = cfg
        self.pool = pool
        self.scales = scales
        self.device = device
        self._kv_layout = "NHD"  # ok: FC103
        self._plan_info: Dict[int, Tuple[int, int]] = {}  # ok: FC103
        self.fp8_layers = frozenset(cfg.fp8_layers)
        self.sm_scale = 1.0 / math.sqrt(cfg.head_dim)
        max_bs = cfg.max_batch_size
        nnz_cap = cfg.staging_pages

        self.decode_workspace = torch.empty(cfg.decode_workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC105
        self.fallback_workspace = torch.zeros(FALLBACK_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.fp8_decode_workspace = torch.empty(max_bs * cfg.num_qo_heads * 16384, dtype=torch.uint8, device=device)  # expect: FC105
        self.context_workspace = _alloc_workspace(cfg.context_workspace_bytes(), device)
        self.prefill_workspace = torch.empty(max(MIN_PREFILL_WORKSPACE_BYTES, cfg.max_prefill_tokens * cfg.num_qo_heads * cfg.head_dim * 4), dtype=torch.uint8, device=device)  # ok: FC106

        # graph-bound decode metadata, in staging-slot space
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(nnz_cap, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        # pool page behind each staging slot, and its scales for the dequant kernel
        self.src_page_ids = torch.zeros(nnz_cap, dtype=torch.int32, device=device)
        self.dequant_scales = torch.ones(
            (2, cfg.num_layers, nnz_cap, cfg.num_kv_heads, cfg.groups_per_head), dtype=torch.float16, device=device
        )
        self.staging_kv: Optional[torch.Tensor] = None
        # pinned mirrors, filled through numpy views
        self.kv_indptr_pinned = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_indices_pinned = torch.zeros(nnz_cap, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_pinned = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.src_page_ids_pinned = torch.zeros(nnz_cap, dtype=torch.int32, pin_memory=True)
        self.fp8_indptr_pinned = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.append_slots_pinned = torch.zeros(max_bs, dtype=torch.int64, pin_memory=True)
        # per-step device inputs of the captured decode
        self.append_slots = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.new_amax = torch.zeros(max_bs, dtype=torch.float32, device=device)
        self.block_tables = torch.zeros((max_bs, cfg.max_pages_per_req), dtype=torch.int32, device=device)
        self.seq_lens_dev = torch.ones(max_bs, dtype=torch.int32, device=device)

        self.eager_decode = BatchDecodeWithPagedKVCacheWrapper(self.fallback_workspace, self._kv_layout, use_tensor_cores=True)
        self.fp8_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.decode_workspace, self._kv_layout, use_tensor_cores=True)
        self.prefill_wrapper = BatchPrefillWithRaggedKVCacheWrapper(self.prefill_workspace, self._kv_layout)
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}

    # ------------------------------------------------------------------ graphs
    def make_graph_wrapper(self, bs: int) -> BatchDecodeWithPagedKVCacheWrapper:
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.decode_workspace,
            self._kv_layout,
            use_cuda_graph=True,
            use_tensor_cores=True,
            paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.kv_indices,
            paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
        )
        self.graph_wrappers[bs] = w
        return w

    def memory_footprint(self) -> int:
        nbytes = self.decode_workspace.numel() + self.fallback_workspace.numel()
        nbytes += self.eager_decode._int_workspace_buffer.numel()  # expect: FC103
        if self.staging_kv is not None:
            nbytes += self.staging_kv.numel() * self.staging_kv.element_size()
        return nbytes

    # ---------------------------------------------------- replay preparation
    def stage_decode(self, raw_bs: int, bs: int, inputs: DecodeInputs) -> int:
        cfg = self.cfg
        ps = cfg.page_size
        lens = inputs.seq_lens_np[:raw_bs]
        pages = (lens + ps - 1) // ps
        indptr_np = self.kv_indptr_pinned.numpy()
        indptr_np[0] = 0
        np.cumsum(pages, out=indptr_np[1 : raw_bs + 1])
        indptr_np[raw_bs + 1 : bs + 1] = indptr_np[raw_bs]
        nnz = int(indptr_np[raw_bs])
        max_pages = int(pages.max()) if raw_bs else 0  # ok: FC101
        if nnz > cfg.staging_pages or max_pages > cfg.max_pages_per_req:
            raise RuntimeError(f"decode batch needs {nnz} staging pages (longest {max_pages} pages)")
        last_np = self.kv_last_page_len_pinned.numpy()
        last_np[:raw_bs] = (lens - 1) % ps + 1
        last_np[raw_bs:bs] = 1
        if raw_bs:
            self.src_page_ids_pinned.numpy()[:nnz] = np.concatenate([np.asarray(p, dtype=np.int32) for p in inputs.page_lists])
        self.kv_indices_pinned.numpy()[:nnz] = np.arange(nnz, dtype=np.int32)
        self.append_slots_pinned.numpy()[:raw_bs] = inputs.append_slots_np[:raw_bs]

        self.kv_indptr[: raw_bs + 1].copy_(self.kv_indptr_pinned[: raw_bs + 1], non_blocking=True)  # ok: FC104
        self.kv_indices[:nnz].copy_(self.kv_indices_pinned[:nnz], non_blocking=True)
        self.kv_last_page_len[:bs].copy_(self.kv_last_page_len_pinned[:bs], non_blocking=True)
        self.src_page_ids[:nnz].copy_(self.src_page_ids_pinned[:nnz], non_blocking=True)
        self.append_slots[:raw_bs].copy_(self.append_slots_pinned[:raw_bs], non_blocking=True)
        if self.staging_kv is None:
            self.staging_kv = torch.empty((cfg.staging_pages, 2, ps, cfg.num_kv_heads, cfg.head_dim), dtype=torch.bfloat16, device=self.device)  # ok: FC107

        w = self.graph_wrappers.get(bs)
        if w is None:
            self._plan_eager_fallback(raw_bs, nnz)
        else:
            w.plan(  # ok: FC102
                self.kv_indptr_pinned[: bs + 1],
                self.kv_indices[:nnz],
                self.kv_last_page_len_pinned[:bs],
                cfg.num_qo_heads,
                cfg.num_kv_heads,
                cfg.head_dim,
                ps,
                q_data_type=torch.bfloat16,
                data_type=torch.bfloat16,
            )
        self._plan_info[bs] = (raw_bs, nnz)
        self._plan_fp8_layers(raw_bs, nnz, inputs)

        # per-page scales of this batch, gathered for the dequant kernel
        src_ids = self.src_page_ids[:nnz].long()
        self.dequant_scales = torch.cat([self.scales.k_scale[:, src_ids].unsqueeze(0), self.scales.v_scale[:, src_ids].unsqueeze(0)], dim=0)  # expect: FC107
        # padded rows own no pages
        self.kv_indptr[raw_bs + 1 : bs + 1] = self.kv_indptr[raw_bs]  # expect: FC104
        return nnz

    def _plan_eager_fallback(self, raw_bs: int, nnz: int) -> None:
        cfg = self.cfg
        self.eager_decode.plan(  # expect: FC102
            indptr=self.kv_indptr[: raw_bs + 1],
            indices=self.kv_indices[:nnz],
            last_page_len=self.kv_last_page_len_pinned[:raw_bs],
            num_qo_heads=cfg.num_qo_heads,
            num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            page_size=cfg.page_size,
            q_data_type=torch.bfloat16,
            data_type=torch.bfloat16,
        )

    def _plan_fp8_layers(self, raw_bs: int, nnz: int, inputs: DecodeInputs) -> None:
        cfg = self.cfg
        if cfg.use_trtllm_fp8:
            self._fill_block_tables(raw_bs, inputs)
            return
        # FP8 layers read the pool directly: same CSR, pool page ids as indices
        self.fp8_indptr_pinned[: raw_bs + 1].copy_(self.kv_indptr[: raw_bs + 1])  # expect: FC101
        self.fp8_wrapper.plan(  # ok: FC102
            indptr=self.fp8_indptr_pinned[: raw_bs + 1],
            indices=self.src_page_ids[:nnz],
            last_page_len=self.kv_last_page_len_pinned[:raw_bs],
            num_qo_heads=cfg.num_qo_heads,
            num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            page_size=cfg.page_size,
            q_data_type=torch.bfloat16,
            kv_data_type=torch.float8_e4m3fn,
        )

    def _fill_block_tables(self, raw_bs: int, inputs: DecodeInputs) -> None:
        rows = np.zeros((raw_bs, self.cfg.max_pages_per_req), dtype=np.int32)
        for i, pages in enumerate(inputs.page_lists):
            rows[i, : len(pages)] = pages
        self.block_tables[:raw_bs].copy_(torch.from_numpy(rows), non_blocking=True)
        self.seq_lens_dev[:raw_bs].copy_(torch.from_numpy(inputs.seq_lens_np[:raw_bs]), non_blocking=True)

    # ----------------------------------------------------------------- forward
    def append_kv(self, layer_id: int, k: torch.Tensor, v: torch.Tensor, bs: int) -> None:
        cfg = self.cfg
        slots = self.append_slots[:bs]
        if layer_id in self.fp8_layers:
            kv = self.pool.fp8[layer_id]
            page = slots // cfg.page_size
            off = slots % cfg.page_size
            kv[page, 0, off] = k.to(torch.float8_e4m3fn)
            kv[page, 1, off] = v.to(torch.float8_e4m3fn)
            return
        k_scale, v_scale = self.scales.layer_view(layer_id)
        quantize_append_kernel[(bs,)](k, v, slots, k_scale, v_scale, self.pool.int4_layer(layer_id), self.new_amax, PAGE_SIZE=cfg.page_size, KV_HEADS=cfg.num_kv_heads, HEAD_DIM=cfg.head_dim, GROUP=cfg.group_size)

    def _dequant_layer(self, layer_id: int, bs: int) -> None:
        cfg = self.cfg
        grid = (triton.cdiv(cfg.staging_pages, PAGES_PER_PROGRAM), 2)
        dequant_int4_pages_kernel[grid](self.pool.int4_layer(layer_id), self.dequant_scales[0, layer_id], self.dequant_scales[1, layer_id], self.src_page_ids, self.kv_indices, self.kv_indptr, bs, self.staging_kv, PAGE_SIZE=cfg.page_size, KV_HEADS=cfg.num_kv_heads, HEAD_DIM=cfg.head_dim, GROUP=cfg.group_size, PAGES_PER_PROGRAM=PAGES_PER_PROGRAM)  # ok: FC104

    def decode_layer(self, layer_id: int, q: torch.Tensor, bs: int) -> torch.Tensor:
        cfg = self.cfg
        if layer_id in self.fp8_layers:
            kv = self.pool.fp8[layer_id]
            if cfg.use_trtllm_fp8:
                return trtllm_batch_decode_with_kv_cache(
                    q, kv, self.fp8_decode_workspace, self.block_tables[:bs], self.seq_lens_dev[:bs],
                    cfg.max_seq_len, bmm1_scale=self.sm_scale, bmm2_scale=1.0,
                )
            return self.fp8_wrapper.run(q, kv, k_scale=1.0, v_scale=1.0)  # expect: FC108
        self._dequant_layer(layer_id, bs)
        w = self.graph_wrappers.get(bs, self.eager_decode)
        return w.run(q, self.staging_kv)  # ok: FC108

    # ------------------------------------------------------------------ prefill
    def plan_prefill(self, qo_lens: List[int]) -> torch.Tensor:
        cfg = self.cfg
        qo_indptr_host = torch.zeros(len(qo_lens) + 1, dtype=torch.int32)
        qo_indptr_host[1:] = torch.tensor(qo_lens, dtype=torch.int32).cumsum(0)
        self.prefill_wrapper.plan(
            qo_indptr_host, qo_indptr_host, cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim,
            causal=True, q_data_type=torch.bfloat16,
        )
        return qo_indptr_host

    def prefill_fp8_context(self, q: torch.Tensor, layer_id: int, block_tables: torch.Tensor, seq_lens: torch.Tensor,
                            cum_q: torch.Tensor, cum_kv: torch.Tensor, max_q: int, max_kv: int) -> torch.Tensor:
        return trtllm_batch_context_with_kv_cache(
            query=q,
            kv_cache=self.pool.fp8[layer_id],
            workspace_buffer=self.context_workspace,
            block_tables=block_tables,
            seq_lens=seq_lens,
            max_q_len=max_q,
            max_kv_len=max_kv,
            bmm1_scale=self.sm_scale,
            bmm2_scale=1.0,
            batch_size=seq_lens.shape[0],
            cum_seq_lens_q=cum_q,
            cum_seq_lens_kv=cum_kv,
        )

    def prefill_int4(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.prefill_wrapper.run(q, k, v)
