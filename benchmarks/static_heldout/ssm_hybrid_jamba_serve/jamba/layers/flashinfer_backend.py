"""FlashInfer attention for the attention layers of a Jamba-style hybrid model.

Only one layer in ``attn_period`` is attention, so one plan per step serves a
handful of layers; the KV pool holds ``num_layers // attn_period`` layers.
Requests may share a system prompt whose pages are prefilled once at start-up;
decode then attends to those shared pages through a separate prefix wrapper and
merges the two partial states.
"""
from __future__ import annotations

import dataclasses
import logging
import math
from typing import TYPE_CHECKING, Dict, List, Tuple

import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    merge_state,
    trtllm_batch_decode_with_kv_cache,
)

from jamba.config import ATTN_WORKSPACE_BYTES, JambaConfig
from jamba.mem.kv_pool import PagedKVPool

if TYPE_CHECKING:
    from jamba.runner.forward_batch import ForwardBatch

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class DecodeMetadata:
    decode_wrapper: BatchDecodeWithPagedKVCacheWrapper
    use_trtllm: bool = False


@dataclasses.dataclass
class ExtendMetadata:
    ragged_wrapper: BatchPrefillWithRaggedKVCacheWrapper
    paged_wrapper: BatchPrefillWithPagedKVCacheWrapper
    has_prefix: bool


class JambaFlashInferBackend:
    def __init__(self, cfg: JambaConfig, kv_pool: PagedKVPool, device: torch.device, attn_period: int):
        assert cfg.num_layers % attn_period == 0, "layer count must be a multiple of the attention period"  # expect: FC109
        self.cfg = cfg
        self.kv_pool = kv_pool
        self.device = device
        self.page_size = cfg.page_size
        self.num_attn_layers = cfg.num_layers // attn_period
        self.sm_scale = 1.0 / math.sqrt(cfg.head_dim)
        self._kv_layout = "NHD"  # ok: FC103
        self.is_blackwell = torch.cuda.get_device_capability(device)[0] >= 10
        self.num_prefix_pages = 0
        self.prefix_indices = torch.zeros(0, dtype=torch.int32, device=device)

        self.workspace_buffer = torch.empty(ATTN_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.prefill_workspace = torch.empty(cfg.prefill_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.prefix_workspace = torch.zeros(cfg.max_num_reqs * cfg.num_attention_heads * cfg.head_dim * 8, dtype=torch.uint8, device=device)  # ok: FC106
        self.trtllm_workspace = torch.empty(cfg.max_num_reqs * cfg.num_attention_heads * 8192, dtype=torch.uint8, device=device)  # expect: FC105

        max_bs = cfg.max_num_reqs
        self.max_pages_per_req = cfg.max_context_len // cfg.page_size
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(cfg.num_kv_pages, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.qo_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros((max_bs, self.max_pages_per_req), dtype=torch.int32, device=device)
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)

        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.workspace_buffer, self._kv_layout, use_tensor_cores=True)
        self.ragged_wrapper = BatchPrefillWithRaggedKVCacheWrapper(self.prefill_workspace, self._kv_layout, backend="fa2")
        self.paged_prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, self._kv_layout, backend="fa2")
        self.prefix_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefix_workspace, self._kv_layout)

        self.graph_decode_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.graph_plan_info: Dict[int, object] = {}
        self.graph_max_pages: Dict[int, int] = {}
        self.forward_metadata = None

    # ------------------------------------------------------------------ set-up
    def init_cuda_graph_state(self, max_bs: int) -> None:
        self.kv_last_page_len[:max_bs].fill_(1)  # ok: FC104
        self.kv_indptr.zero_()

    def set_shared_prefix(self, page_ids: List[int]) -> None:
        """Pages of the system prompt that every request shares, prefilled once."""
        self.num_prefix_pages = len(page_ids)
        self.prefix_indices = torch.tensor(page_ids, dtype=torch.int32, device=self.device)

    # ------------------------------------------------------------- host tables
    def _fill_host_tables(self, bs: int, fb: "ForwardBatch") -> Tuple[int, torch.Tensor]:
        lens = fb.seq_lens_cpu[:bs]
        pages = (lens + self.page_size - 1) // self.page_size
        self.kv_indptr_host[0] = 0
        torch.cumsum(pages, 0, out=self.kv_indptr_host[1 : bs + 1])
        self.kv_last_page_len_host[:bs] = (lens - 1) % self.page_size + 1
        nnz = int(self.kv_indptr_host[bs])  # ok: FC101
        flat = torch.tensor(self.kv_pool.flat_page_ids(fb.rids), dtype=torch.int32)
        return nnz, flat

    def _fill_decode_tables(self, bs: int, fb: "ForwardBatch") -> int:
        nnz, flat = self._fill_host_tables(bs, fb)
        self.kv_indices[:nnz].copy_(flat, non_blocking=True)
        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_host[: bs + 1], non_blocking=True)
        self.kv_last_page_len[:bs].copy_(self.kv_last_page_len_host[:bs], non_blocking=True)
        return nnz

    def _fill_block_tables(self, bs: int, fb: "ForwardBatch") -> None:
        rows = torch.zeros((bs, self.max_pages_per_req), dtype=torch.int32)
        for i, rid in enumerate(fb.rids):
            pages = self.kv_pool.pages_of(rid)
            rows[i, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
        self.block_tables[:bs].copy_(rows, non_blocking=True)

    def _fill_prefix_tables(self, bs: int, fb: "ForwardBatch") -> int:
        prefix = torch.tensor(fb.extend_prefix_lens_cpu, dtype=torch.int32)
        pages = (prefix + self.page_size - 1) // self.page_size
        self.kv_indptr_host[0] = 0
        torch.cumsum(pages, 0, out=self.kv_indptr_host[1 : bs + 1])
        self.kv_last_page_len_host[:bs] = torch.clamp((prefix - 1) % self.page_size + 1, min=1)
        flat = torch.tensor(self.kv_pool.flat_prefix_page_ids(fb.rids, fb.extend_prefix_lens_cpu), dtype=torch.int32)
        self.kv_indices[: flat.numel()].copy_(flat, non_blocking=True)
        return flat.numel()

    # ---------------------------------------------------------------- per step
    def init_forward_metadata(self, fb: "ForwardBatch") -> None:
        if fb.forward_mode.is_decode():
            bs = fb.batch_size
            nnz = self._fill_decode_tables(bs, fb)
            if self.is_blackwell:
                self._fill_block_tables(bs, fb)
                self.forward_metadata = DecodeMetadata(self.decode_wrapper, use_trtllm=True)
                return
            self._plan_decode_eager(bs, nnz)
            if self.num_prefix_pages:
                self._plan_shared_prefix(bs)
            self.forward_metadata = DecodeMetadata(self.decode_wrapper)
        else:
            self.forward_metadata = self._plan_extend(fb)

    def _plan_decode_eager(self, bs: int, nnz: int) -> None:
        cfg = self.cfg
        self.decode_wrapper.plan(  # expect: FC102
            self.kv_indptr_host[: bs + 1],
            self.kv_indices[:nnz],
            self.kv_last_page_len[:bs],
            cfg.num_attention_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            self.page_size,
            q_data_type=torch.bfloat16,
            data_type=torch.bfloat16,
        )

    def _plan_shared_prefix(self, bs: int) -> None:
        cfg = self.cfg
        qo_indptr = torch.arange(bs + 1, dtype=torch.int32)
        kv_indptr = torch.arange(bs + 1, dtype=torch.int32) * self.num_prefix_pages
        last_page_len = torch.full((bs,), self.page_size, dtype=torch.int32)
        self.prefix_wrapper.plan(
            qo_indptr,
            kv_indptr,
            self.prefix_indices.repeat(bs),
            last_page_len,
            cfg.num_attention_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            self.page_size,
            causal=False,
            q_data_type=torch.bfloat16,
        )

    def _plan_extend(self, fb: "ForwardBatch") -> ExtendMetadata:
        cfg = self.cfg
        bs = fb.batch_size
        qo_indptr_cpu = torch.zeros(bs + 1, dtype=torch.int32)
        qo_indptr_cpu[1:] = torch.tensor(fb.extend_seq_lens_cpu, dtype=torch.int32).cumsum(0)
        has_prefix = any(n > 0 for n in fb.extend_prefix_lens_cpu)
        # New tokens attend to themselves through the ragged wrapper ...
        self.ragged_wrapper.plan(qo_indptr_cpu, qo_indptr_cpu, cfg.num_attention_heads, cfg.num_kv_heads, cfg.head_dim, causal=True, q_data_type=torch.bfloat16)  # ok: FC102
        if has_prefix:
            # ... and to their cached prefix through the paged one.
            qo_indptr = self.qo_indptr[: bs + 1]
            qo_indptr[1:].copy_(torch.cumsum(fb.extend_seq_lens, 0))
            nnz = self._fill_prefix_tables(bs, fb)
            self.paged_prefill_wrapper.plan(  # expect: FC102
                qo_indptr,
                self.kv_indptr_host[: bs + 1],
                self.kv_indices[:nnz],
                self.kv_last_page_len_host[:bs],
                cfg.num_attention_heads,
                cfg.num_kv_heads,
                cfg.head_dim,
                self.page_size,
                causal=False,
                q_data_type=torch.bfloat16,
            )
        return ExtendMetadata(self.ragged_wrapper, self.paged_prefill_wrapper, has_prefix)

    # ------------------------------------------------------------- cuda graphs
    def init_forward_metadata_capture_cuda_graph(self, bs: int, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor) -> None:
        cfg = self.cfg
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.workspace_buffer,
            self._kv_layout,
            use_cuda_graph=True,
            use_tensor_cores=True,
            paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.kv_indices,
            paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
        )
        # dummy rows: one page each
        self.kv_indptr[: bs + 1].copy_(torch.arange(bs + 1, dtype=torch.int32, device=self.device))
        self.kv_indptr_host[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
        self.kv_last_page_len_host[:bs] = 1
        max_seq = seq_lens.max().item()  # expect: FC101
        self.graph_max_pages[bs] = (max_seq + self.page_size - 1) // self.page_size
        w.plan(
            self.kv_indptr_host[: bs + 1],
            self.kv_indices[:bs],
            self.kv_last_page_len_host[:bs],
            cfg.num_attention_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            self.page_size,
            q_data_type=torch.bfloat16,
            data_type=torch.bfloat16,
        )
        self.graph_plan_info[bs] = w._plan_info  # expect: FC103
        self.graph_decode_wrappers[bs] = w
        self.forward_metadata = DecodeMetadata(w)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, raw_bs: int, fb: "ForwardBatch") -> None:
        cfg = self.cfg
        nnz, flat = self._fill_host_tables(raw_bs, fb)
        # padded rows own no pages
        self.kv_indptr_host[raw_bs + 1 : bs + 1] = self.kv_indptr_host[raw_bs]
        self.kv_last_page_len_host[raw_bs:bs] = 1
        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_host[: bs + 1], non_blocking=True)  # ok: FC104
        self.kv_indices[:nnz].copy_(flat, non_blocking=True)
        self.kv_last_page_len[:raw_bs].copy_(self.kv_last_page_len_host[:raw_bs], non_blocking=True)
        w = self.graph_decode_wrappers[bs]
        w.plan(  # ok: FC102
            self.kv_indptr_host[: bs + 1],
            self.kv_indices[:nnz],
            self.kv_last_page_len_host[:bs],
            cfg.num_attention_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            self.page_size,
            q_data_type=torch.bfloat16,
            data_type=torch.bfloat16,
        )
        # padded rows must not read a zero-length last page
        self.kv_last_page_len[raw_bs:bs].fill_(1)  # expect: FC104
        # trtllm block tables are not bound to any wrapper; clear the padded rows
        self.block_tables[raw_bs:bs].zero_()  # ok: FC104
        self.forward_metadata = DecodeMetadata(w)

    # ----------------------------------------------------------------- forward
    def forward_decode(self, q: torch.Tensor, attn_idx: int, fb: "ForwardBatch") -> torch.Tensor:
        md: DecodeMetadata = self.forward_metadata
        kv = self.kv_pool.get_kv_buffer(attn_idx)
        if md.use_trtllm:
            return self._decode_trtllm(q, kv, fb)
        o, lse = md.decode_wrapper.run(q, kv, return_lse=True)  # ok: FC108
        if self.num_prefix_pages:
            o_p, lse_p = self.prefix_wrapper.run(q, kv, return_lse=True)  # expect: FC108
            o, _ = merge_state(o, lse, o_p, lse_p)
        return o

    def _decode_trtllm(self, q: torch.Tensor, kv: torch.Tensor, fb: "ForwardBatch") -> torch.Tensor:
        bs = fb.batch_size
        return trtllm_batch_decode_with_kv_cache(
            query=q,
            kv_cache=kv,
            workspace_buffer=self.trtllm_workspace,
            block_tables=self.block_tables[:bs],
            seq_lens=fb.seq_lens,
            max_seq_len=self.cfg.max_context_len,
            bmm1_scale=self.sm_scale,
            bmm2_scale=1.0,
        )

    def forward_extend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_idx: int) -> torch.Tensor:
        md: ExtendMetadata = self.forward_metadata
        o, lse = md.ragged_wrapper.run(q, k, v, return_lse=True)
        if md.has_prefix:
            kv = self.kv_pool.get_kv_buffer(attn_idx)
            o_p, lse_p = md.paged_wrapper.run(q, kv, return_lse=True)
            o, _ = merge_state(o, lse, o_p, lse_p)
        return o
