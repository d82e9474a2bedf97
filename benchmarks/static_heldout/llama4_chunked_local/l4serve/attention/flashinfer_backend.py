"""FlashInfer metadata builders and attention impls, one set per layer group.

Global layers (NoPE, full causal attention) use ``FlashInferMetadataBuilder``: an eager decode wrapper, a
paged prefill wrapper, and graph-mode decode wrappers per captured batch size bound to persistent buffers.
Local layers use ``LocalChunkedMetadataBuilder``: the same requests re-cut into virtual batches, with their own
buffers and wrappers, so both groups plan independently every step.
"""

from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass
from typing import Dict, Optional

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from l4serve.attention.common import (
    CommonAttentionMetadata,
    VirtualBatches,
    make_local_attention_virtual_batches,
    split_decodes_and_prefills,
)
from l4serve.config import Llama4Config

# prefill workspace per layer group, in MiB
_WS_MIB = {"global": 384, "local": 192}


@dataclass
class FlashInferMetadata:
    num_actual_tokens: int
    num_decodes: int
    num_prefills: int
    num_decode_tokens: int
    slot_mapping: torch.Tensor
    decode_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper]
    prefill_wrapper: Optional[BatchPrefillWithPagedKVCacheWrapper]


@dataclass
class LocalAttentionMetadata:
    num_actual_tokens: int
    num_virtual_decodes: int
    num_virtual_prefills: int
    num_decode_tokens: int
    slot_mapping: torch.Tensor
    virtual_decode_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper]
    virtual_prefill_wrapper: Optional[BatchPrefillWithPagedKVCacheWrapper]


class FlashInferMetadataBuilder:
    def __init__(self, cfg: Llama4Config, device: torch.device, group: str = "global", decode_backend: str = "fa2"):
        self.cfg = cfg
        self.device = device
        self.group = group
        self.decode_backend = decode_backend
        self._kv_layout = cfg.kv_layout  # ok: FC103
        self.capture_sizes = sorted(cfg.cudagraph_batch_sizes)
        max_reqs = cfg.max_num_reqs

        self._workspace = torch.empty(cfg.workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105
        self._graph_workspace = torch.empty(cfg.graph_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self._prefill_workspace = torch.zeros(_WS_MIB[group] << 20, dtype=torch.uint8, device=device)  # expect: FC106

        self.paged_kv_indptr = torch.zeros(max_reqs + 1, dtype=torch.int32, device=device)
        self.paged_kv_indices = torch.zeros(cfg.max_num_blocks, dtype=torch.int32, device=device)
        self.paged_kv_last_page_len = torch.ones(max_reqs, dtype=torch.int32, device=device)
        self.paged_kv_indptr_cpu = torch.zeros(max_reqs + 1, dtype=torch.int32, pin_memory=True)
        self.paged_kv_last_page_len_cpu = torch.ones(max_reqs, dtype=torch.int32, pin_memory=True)

        self._decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(
            self._workspace, self._kv_layout, backend=self.decode_backend
        )
        self._prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self._prefill_workspace, self._kv_layout)
        self._graph_decode_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self._decode_plan = functools.partial(
            self._decode_wrapper.plan,
            num_qo_heads=cfg.num_qo_heads,
            num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            page_size=cfg.block_size,
            q_data_type=cfg.dtype,
        )

    def _heads(self):
        return self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim, self.cfg.block_size

    def _prefill_kwargs(self) -> dict:
        c = self.cfg
        return dict(num_qo_heads=c.num_qo_heads, num_kv_heads=c.num_kv_heads, head_dim_qk=c.head_dim,
                    page_size=c.block_size, causal=True, q_data_type=c.dtype)

    def _padded_size(self, n: int) -> int:
        i = bisect.bisect_left(self.capture_sizes, n)
        return self.capture_sizes[i] if i < len(self.capture_sizes) else n

    def _get_graph_decode_wrapper(self, bs: int) -> BatchDecodeWithPagedKVCacheWrapper:
        wrapper = self._graph_decode_wrappers.get(bs)
        if wrapper is None:
            wrapper = BatchDecodeWithPagedKVCacheWrapper(
                self._graph_workspace, self._kv_layout, use_cuda_graph=True, backend="fa2",
                paged_kv_indptr_buffer=self.paged_kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.paged_kv_indices,
                paged_kv_last_page_len_buffer=self.paged_kv_last_page_len[:bs],
            )
            self._graph_decode_wrappers[bs] = wrapper
        return wrapper

    def _plan_decode(self, common: CommonAttentionMetadata, num_decodes: int, padded: int, use_cudagraph: bool):
        bs = self.cfg.block_size
        seq_lens_cpu = common.seq_lens_cpu[:num_decodes]
        blocks_cpu = (seq_lens_cpu + bs - 1) // bs
        self.paged_kv_indptr_cpu[0] = 0
        torch.cumsum(blocks_cpu, dim=0, out=self.paged_kv_indptr_cpu[1 : num_decodes + 1])
        self.paged_kv_indptr_cpu[num_decodes + 1 : padded + 1] = self.paged_kv_indptr_cpu[num_decodes]
        self.paged_kv_last_page_len_cpu[:num_decodes] = (seq_lens_cpu - 1) % bs + 1
        num_blocks = int(self.paged_kv_indptr_cpu[num_decodes])

        table_cpu = common.block_table_cpu[:num_decodes]
        mask_cpu = torch.arange(table_cpu.shape[1])[None, :] < blocks_cpu[:, None]
        indices_cpu = table_cpu[mask_cpu]  # ok: FC101
        self.paged_kv_indices[:num_blocks].copy_(indices_cpu, non_blocking=True)  # ok: FC104
        self.paged_kv_last_page_len[:num_decodes].copy_(self.paged_kv_last_page_len_cpu[:num_decodes], non_blocking=True)
        if use_cudagraph:
            wrapper = self._get_graph_decode_wrapper(padded)
            wrapper.plan(  # ok: FC102
                self.paged_kv_indptr_cpu[: padded + 1], self.paged_kv_indices[:num_blocks],
                self.paged_kv_last_page_len_cpu[:padded], *self._heads(), q_data_type=self.cfg.dtype,
            )
            return wrapper
        self._decode_plan(  # expect: FC102
            self.paged_kv_indptr_cpu[: num_decodes + 1],
            self.paged_kv_indices[:num_blocks],
            self.paged_kv_last_page_len[:num_decodes],
        )
        return self._decode_wrapper

    def _plan_prefill(self, common: CommonAttentionMetadata, num_decodes: int, num_decode_tokens: int):
        bs = self.cfg.block_size
        qo_indptr_cpu = common.query_start_loc_cpu[num_decodes:] - num_decode_tokens
        seq_lens_cpu = common.seq_lens_cpu[num_decodes:]
        blocks_cpu = (seq_lens_cpu + bs - 1) // bs
        kv_indptr_cpu = torch.zeros(len(blocks_cpu) + 1, dtype=torch.int32)
        torch.cumsum(blocks_cpu, dim=0, out=kv_indptr_cpu[1:])
        table_cpu = common.block_table_cpu[num_decodes : common.num_reqs]
        mask_cpu = torch.arange(table_cpu.shape[1])[None, :] < blocks_cpu[:, None]
        kv_indices = table_cpu[mask_cpu].to(self.device, non_blocking=True)
        last_page_len_cpu = (seq_lens_cpu - 1) % bs + 1
        self._prefill_wrapper.plan(  # ok: FC102
            qo_indptr=qo_indptr_cpu, paged_kv_indptr=kv_indptr_cpu, paged_kv_indices=kv_indices,
            paged_kv_last_page_len=last_page_len_cpu, **self._prefill_kwargs(),
        )
        return self._prefill_wrapper

    def build(self, common: CommonAttentionMetadata, use_cudagraph: bool = False) -> FlashInferMetadata:
        if common.max_seq_len > self.cfg.max_model_len:
            raise ValueError(f"seq_lens {common.seq_lens} exceed max_model_len={self.cfg.max_model_len}")  # ok: FC101
        num_decodes, num_prefills, num_decode_tokens = split_decodes_and_prefills(common)
        padded = self._padded_size(num_decodes) if use_cudagraph else num_decodes
        decode_wrapper = None
        if num_decodes:
            decode_wrapper = self._plan_decode(common, num_decodes, padded, use_cudagraph)
        prefill_wrapper = None
        if num_prefills:
            prefill_wrapper = self._plan_prefill(common, num_decodes, num_decode_tokens)
        if padded > num_decodes:
            # padded graph rows must read a valid one-token page
            self.paged_kv_last_page_len[num_decodes:padded].fill_(1)  # expect: FC104
        return FlashInferMetadata(
            common.num_actual_tokens, num_decodes, num_prefills, num_decode_tokens, common.slot_mapping,
            decode_wrapper=decode_wrapper, prefill_wrapper=prefill_wrapper,
        )

    def build_for_cudagraph_capture(self, common: CommonAttentionMetadata) -> FlashInferMetadata:
        """A uniform decode batch of the captured size; every replay plans again with the real batch."""
        n = common.num_reqs
        wrapper = self._get_graph_decode_wrapper(n)
        self.paged_kv_indptr_cpu[: n + 1].copy_(torch.arange(n + 1, dtype=torch.int32))
        self.paged_kv_last_page_len_cpu[:n].fill_(1)
        wrapper.plan(
            self.paged_kv_indptr_cpu[: n + 1], self.paged_kv_indices[:n], self.paged_kv_last_page_len_cpu[:n],
            *self._heads(), q_data_type=self.cfg.dtype,
        )
        return FlashInferMetadata(n, n, 0, n, common.slot_mapping, decode_wrapper=wrapper, prefill_wrapper=None)


class LocalChunkedMetadataBuilder(FlashInferMetadataBuilder):
    def __init__(self, cfg: Llama4Config, device: torch.device):
        super().__init__(cfg, device, group="local", decode_backend="fa2")
        self.attn_chunk_size = cfg.attn_chunk_size
        self.pages_per_chunk = cfg.pages_per_chunk
        max_virtual = cfg.max_num_reqs
        self._virtual_workspace = torch.zeros(cfg.virtual_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC106
        self.virtual_kv_indptr = torch.zeros(max_virtual + 1, dtype=torch.int32, device=device)
        self.virtual_kv_indices = torch.zeros(max_virtual * self.pages_per_chunk, dtype=torch.int32, device=device)
        self.virtual_kv_last_page_len = torch.ones(max_virtual, dtype=torch.int32, device=device)
        self.virtual_seq_lens = torch.zeros(max_virtual, dtype=torch.int32, device=device)
        self.virtual_cu_seqlens_cpu = torch.zeros(max_virtual + 1, dtype=torch.int32, pin_memory=True)
        self._virtual_decode_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self._virtual_prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self._virtual_workspace, self._kv_layout)
        self._check_virtual_capacity()

    def _check_virtual_capacity(self) -> None:
        assert self.virtual_kv_indices.numel() >= self.cfg.max_num_reqs * self.pages_per_chunk  # ok: FC109

    def _get_virtual_decode_wrapper(self, bs: int) -> BatchDecodeWithPagedKVCacheWrapper:
        wrapper = self._virtual_decode_wrappers.get(bs)
        if wrapper is None:
            wrapper = BatchDecodeWithPagedKVCacheWrapper(
                self._virtual_workspace, self._kv_layout,
                paged_kv_indptr_buffer=self.virtual_kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.virtual_kv_indices,
                paged_kv_last_page_len_buffer=self.virtual_kv_last_page_len[:bs],
            )
            self._virtual_decode_wrappers[bs] = wrapper
        return wrapper

    def _plan_virtual_decode(self, vb: VirtualBatches, num_decodes: int, padded: int):
        # a decoding request's single query token lives in its last chunk: one virtual batch each
        bs = self.cfg.block_size
        seqlens_k = vb.seqlens_k_np[:num_decodes]
        pages = (seqlens_k + bs - 1) // bs
        indptr_np = np.zeros(padded + 1, dtype=np.int32)
        np.cumsum(pages, out=indptr_np[1 : num_decodes + 1])
        indptr_np[num_decodes + 1 :] = indptr_np[num_decodes]
        last_np = np.ones(padded, dtype=np.int32)
        last_np[:num_decodes] = (seqlens_k - 1) % bs + 1
        rows_np, cols_np = np.nonzero(np.arange(vb.block_table.shape[1])[None, :] < pages[:, None])
        rows = torch.from_numpy(rows_np).to(self.device, non_blocking=True)
        cols = torch.from_numpy(cols_np).to(self.device, non_blocking=True)
        n = len(rows_np)
        self.virtual_kv_indices[:n].copy_(vb.block_table[rows, cols])
        wrapper = self._get_virtual_decode_wrapper(padded)
        wrapper.plan(
            torch.from_numpy(indptr_np), self.virtual_kv_indices[:n], torch.from_numpy(last_np),
            *self._heads(), q_data_type=self.cfg.dtype,
        )
        return wrapper

    def _plan_virtual_prefill(self, vb: VirtualBatches, num_decodes: int):
        bs = self.cfg.block_size
        cu_q = vb.cu_seqlens_q_np[num_decodes:] - vb.cu_seqlens_q_np[num_decodes]
        qo_indptr = torch.from_numpy(cu_q).to(self.device, non_blocking=True)
        seqlens_k = vb.seqlens_k_np[num_decodes:]
        pages = (seqlens_k + bs - 1) // bs
        kv_indptr_cpu = torch.zeros(len(pages) + 1, dtype=torch.int32)
        torch.cumsum(torch.from_numpy(pages), dim=0, out=kv_indptr_cpu[1:])
        rows_np, cols_np = np.nonzero(np.arange(vb.block_table.shape[1])[None, :] < pages[:, None])
        rows = torch.from_numpy(rows_np + num_decodes).to(self.device, non_blocking=True)
        cols = torch.from_numpy(cols_np).to(self.device, non_blocking=True)
        last_page_len_cpu = torch.from_numpy(((seqlens_k - 1) % bs + 1).astype(np.int32))
        self._virtual_prefill_wrapper.plan(  # expect: FC102
            qo_indptr=qo_indptr, paged_kv_indptr=kv_indptr_cpu, paged_kv_indices=vb.block_table[rows, cols],
            paged_kv_last_page_len=last_page_len_cpu, **self._prefill_kwargs(),
        )
        return self._virtual_prefill_wrapper

    def build(self, common: CommonAttentionMetadata, use_cudagraph: bool = False) -> LocalAttentionMetadata:
        if (common.seq_lens > self.cfg.max_model_len).any():  # expect: FC101
            raise ValueError("a sequence is longer than max_model_len")
        vb = make_local_attention_virtual_batches(self.attn_chunk_size, common, self.cfg.block_size)
        nv = vb.num_virtual
        if nv > self.virtual_seq_lens.numel():
            self.virtual_seq_lens = torch.zeros(nv, dtype=torch.int32, device=self.device)  # expect: FC107
        if nv + 1 > self.virtual_cu_seqlens_cpu.numel():
            self.virtual_cu_seqlens_cpu = torch.zeros(nv + 1, dtype=torch.int32, pin_memory=True)  # ok: FC107
        self.virtual_seq_lens[:nv].copy_(torch.from_numpy(vb.seqlens_k_np), non_blocking=True)
        self.virtual_cu_seqlens_cpu[: nv + 1].copy_(torch.from_numpy(vb.cu_seqlens_q_np))

        num_decodes, num_prefills, num_decode_tokens = split_decodes_and_prefills(common)
        padded = self._padded_size(num_decodes) if use_cudagraph else num_decodes
        decode_wrapper = None
        if num_decodes:
            decode_wrapper = self._plan_virtual_decode(vb, num_decodes, padded)
        prefill_wrapper = None
        if num_prefills:
            prefill_wrapper = self._plan_virtual_prefill(vb, num_decodes)
        self.virtual_kv_last_page_len[num_decodes:padded].fill_(1)  # ok: FC104
        return LocalAttentionMetadata(
            common.num_actual_tokens, num_decodes, nv - num_decodes, num_decode_tokens, common.slot_mapping,
            virtual_decode_wrapper=decode_wrapper, virtual_prefill_wrapper=prefill_wrapper,
        )

    def build_for_cudagraph_capture(self, common: CommonAttentionMetadata) -> LocalAttentionMetadata:
        n = common.num_reqs
        wrapper = self._get_virtual_decode_wrapper(n)
        wrapper.plan(
            torch.arange(n + 1, dtype=torch.int32), self.virtual_kv_indices[:n], torch.ones(n, dtype=torch.int32),
            *self._heads(), q_data_type=self.cfg.dtype,
        )
        return LocalAttentionMetadata(n, n, 0, n, common.slot_mapping, virtual_decode_wrapper=wrapper, virtual_prefill_wrapper=None)


def write_kv(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    # kv_cache: [num_blocks, 2, num_kv_heads, block_size, head_dim] (HND)
    num_blocks, _, heads, block_size, dim = kv_cache.shape
    flat = kv_cache.permute(1, 0, 3, 2, 4).reshape(2, num_blocks * block_size, heads, dim)
    flat[0].index_copy_(0, slot_mapping, k)
    flat[1].index_copy_(0, slot_mapping, v)


class FlashInferImpl:
    """Global (NoPE) layers."""

    def __init__(self, cfg: Llama4Config):
        self.scale = cfg.head_dim**-0.5

    def forward(self, q, k, v, kv_cache, meta: FlashInferMetadata) -> torch.Tensor:
        write_kv(k, v, kv_cache, meta.slot_mapping)
        out = torch.empty_like(q)
        nd, n = meta.num_decode_tokens, meta.num_actual_tokens
        if meta.num_decodes:
            out[:nd] = self.forward_decode(q[:nd], kv_cache, meta)
        if meta.num_prefills:
            out[nd:n] = meta.prefill_wrapper.run(q[nd:n], kv_cache)
        return out

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, meta: FlashInferMetadata) -> torch.Tensor:
        return meta.decode_wrapper.run(q, kv_cache)  # ok: FC108


class ChunkedLocalAttentionImpl:
    """Local layers: attention inside each virtual batch."""

    def __init__(self, cfg: Llama4Config):
        self.scale = cfg.head_dim**-0.5

    def forward(self, q, k, v, kv_cache, meta: LocalAttentionMetadata) -> torch.Tensor:
        write_kv(k, v, kv_cache, meta.slot_mapping)
        out = torch.empty_like(q)
        nd, n = meta.num_decode_tokens, meta.num_actual_tokens
        if meta.num_virtual_decodes:
            out[:nd] = self.forward_decode(q[:nd], kv_cache, meta)
        if meta.num_virtual_prefills:
            out[nd:n] = self.forward_prefill(q[nd:n], kv_cache, meta)
        return out

    def forward_prefill(self, q: torch.Tensor, kv_cache: torch.Tensor, meta: LocalAttentionMetadata) -> torch.Tensor:
        w = meta.virtual_prefill_wrapper
        if w._sm_scale not in (None, self.scale):  # expect: FC103
            raise RuntimeError("virtual prefill wrapper was planned with another softmax scale")
        return w.run(q, kv_cache)

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, meta: LocalAttentionMetadata) -> torch.Tensor:
        return meta.virtual_decode_wrapper.run(q, kv_cache)  # expect: FC108
