"""FlashInfer attention for the store-backed engine.

Prefill: a paged prefill wrapper (prefix pages loaded from the store are ordinary pages by now). Decode: graph-mode
wrappers per bucket over shared index buffers, an eager wrapper past the buckets, a two-level cascade when the
whole batch shares a system prompt the store handed back, trtllm-gen for very long sequences.
"""

from __future__ import annotations

import logging
from typing import Dict, Iterable, Union

import numpy as np
import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    MultiLevelCascadeAttentionWrapper,
)
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from kvserve.metadata import DecodeMetadata, PrefillMetadata
from kvserve.page_pool import LocalPagePool
from kvstore import DECODE_WORKSPACE_BYTES, StoreConfig

logger = logging.getLogger(__name__)


def _make_workspace(nbytes: int, device: torch.device, zero_init: bool = True) -> torch.Tensor:
    ws = torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105
    if zero_init:
        ws.zero_()
    return ws


class StoreAwareFlashInferBackend:
    def __init__(self, cfg: StoreConfig, pool: LocalPagePool, load_event: torch.cuda.Event, device: torch.device):
        self.cfg = cfg
        self.pool = pool
        self.device = device
        self.load_event = load_event
        self.sm_scale = cfg.head_dim**-0.5
        n = cfg.max_batch
        per_row = cfg.num_qo_heads * (cfg.head_dim + 1) * 4

        self.graph_workspace = torch.zeros(DECODE_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.prefill_workspace = torch.zeros(cfg.prefill_workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        self.eager_workspace = torch.zeros(4 * n * per_row * 16, dtype=torch.uint8, device=device)
        self.cascade_workspace = torch.zeros(4 * n * per_row * 16, dtype=torch.uint8, device=device)
        self.trtllm_workspace = _make_workspace(4 * n * per_row * 8, device, zero_init=True)

        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, "HND")
        self.eager_decode = BatchDecodeWithPagedKVCacheWrapper(self.eager_workspace, "HND", use_tensor_cores=True)
        self.cascade = MultiLevelCascadeAttentionWrapper(2, self.cascade_workspace, "HND")
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}

        self.kv_indptr = torch.zeros(n + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(n * cfg.max_pages_per_seq, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(n, dtype=torch.int32, device=device)
        self.kv_indptr_host = torch.zeros(n + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_host = torch.ones(n, dtype=torch.int32, pin_memory=True)
        self.graph_bufs = {
            "kv_indptr": self.kv_indptr,
            "kv_indices": self.kv_indices,
            "kv_last_page_len": self.kv_last_page_len,
        }

    # ------------------------------------------------------------ graph set-up

    def init_decode_graph_buffers(self, buckets: Iterable[int]) -> None:
        for bs in sorted(buckets, reverse=True):
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace,
                "HND",
                use_cuda_graph=True,
                use_tensor_cores=True,
                paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
            )
        self.kv_last_page_len.fill_(1)

    def prepare_decode(self, bs: int, padded: int, meta: DecodeMetadata) -> None:
        """Bucket ``padded``: live rows then one-token rows on the null page; fill the bound buffers, then plan."""
        cfg = self.cfg
        indptr = np.zeros(padded + 1, dtype=np.int32)
        indptr[: bs + 1] = meta.kv_indptr_np
        indptr[bs + 1 :] = indptr[bs] + np.arange(1, padded - bs + 1, dtype=np.int32)
        last = np.ones(padded, dtype=np.int32)
        last[:bs] = meta.kv_last_page_len_np
        n_live = int(indptr[bs])
        self.kv_indptr_host[: padded + 1].copy_(torch.from_numpy(indptr))
        self.kv_last_page_len_host[:padded].copy_(torch.from_numpy(last))
        self.kv_indices[:n_live].copy_(meta.kv_indices, non_blocking=True)  # ok: FC104
        self.kv_indices[n_live : int(indptr[-1])].zero_()
        self.kv_indptr[: padded + 1].copy_(self.kv_indptr_host[: padded + 1], non_blocking=True)
        self.kv_last_page_len[:padded].copy_(self.kv_last_page_len_host[:padded], non_blocking=True)
        self.graph_wrappers[padded].plan(  # ok: FC102
            self.kv_indptr_host[: padded + 1],
            self.kv_indices[: int(indptr[-1])],
            self.kv_last_page_len_host[:padded],
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            q_data_type=self.pool.kv_dtype,
            kv_data_type=self.pool.kv_dtype,
        )
        meta.graph_bs = padded

    # ------------------------------------------------------------ eager steps

    def init_forward_metadata(self, meta: Union[PrefillMetadata, DecodeMetadata]) -> None:
        cfg = self.cfg
        # pages the connector pulled from the store land on its load stream
        torch.cuda.current_stream().wait_event(self.load_event)  # ok: FC101
        if isinstance(meta, PrefillMetadata):
            self.prefill_wrapper.plan(  # expect: FC102
                meta.qo_indptr_host,
                meta.kv_indptr_host,
                meta.kv_indices,
                meta.kv_last_page_len,
                cfg.num_qo_heads,
                cfg.num_kv_heads,
                cfg.head_dim,
                cfg.page_size,
                causal=True,
                q_data_type=self.pool.kv_dtype,
                kv_data_type=self.pool.kv_dtype,
            )
            return
        meta.graph_bs = None
        if meta.shared_prefix_pages:
            self._plan_cascade(meta)
            return
        self.eager_decode.plan(  # ok: FC102
            torch.from_numpy(meta.kv_indptr_np),
            meta.kv_indices,
            torch.from_numpy(meta.kv_last_page_len_np),
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            q_data_type=self.pool.kv_dtype,
            kv_data_type=self.pool.kv_dtype,
        )

    def _plan_cascade(self, meta: DecodeMetadata) -> None:
        cfg, bs, shared = self.cfg, meta.batch_size, meta.shared_prefix_pages
        shared_pages = meta.page_lists[0][:shared]
        unique = [p[shared:] for p in meta.page_lists]
        unique_indptr = np.zeros(bs + 1, dtype=np.int32)
        np.cumsum([u.size for u in unique], out=unique_indptr[1:])
        unique_flat = np.concatenate(unique).astype(np.int32)
        self.cascade.plan(
            [torch.tensor([0, bs], dtype=torch.int32), torch.arange(bs + 1, dtype=torch.int32)],
            [torch.tensor([0, shared], dtype=torch.int32), torch.from_numpy(unique_indptr)],
            [
                torch.from_numpy(shared_pages.astype(np.int32)).to(self.device),
                torch.from_numpy(unique_flat).to(self.device),
            ],
            [torch.tensor([cfg.page_size], dtype=torch.int32), torch.from_numpy(meta.kv_last_page_len_np)],
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
        )

    # ---------------------------------------------------------------- kernels

    def store_kv(self, layer_id: int, k: torch.Tensor, v: torch.Tensor, out_cache_loc: torch.Tensor) -> None:
        kv = self.pool.layer(layer_id)
        page, slot = out_cache_loc // self.cfg.page_size, out_cache_loc % self.cfg.page_size
        kv[page, 0, :, slot, :] = k
        kv[page, 1, :, slot, :] = v

    def decode_wrapper_for(self, meta: DecodeMetadata) -> BatchDecodeWithPagedKVCacheWrapper:
        if meta.graph_bs is not None:
            return self.graph_wrappers[meta.graph_bs]
        return self.eager_decode

    def decode_attention(self, q: torch.Tensor, layer_id: int, meta: DecodeMetadata) -> torch.Tensor:
        kv = self.pool.layer(layer_id)
        if meta.shared_prefix_pages:
            return self.cascade.run(q, kv)  # expect: FC108
        if meta.use_trtllm:
            return trtllm_batch_decode_with_kv_cache(
                query=q,
                kv_cache=kv,
                workspace_buffer=self.trtllm_workspace,
                block_tables=meta.block_table,
                seq_lens=meta.seq_lens,
                max_seq_len=meta.max_seq_len,
                bmm1_scale=self.sm_scale,
                bmm2_scale=1.0,
            )
        w = self.decode_wrapper_for(meta)
        return w.run(q, kv)  # ok: FC108

    def prefill_attention(self, q: torch.Tensor, layer_id: int) -> torch.Tensor:
        return self.prefill_wrapper.run(q, self.pool.layer(layer_id))
