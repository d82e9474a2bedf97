"""FlashInfer attention for the VLM: ragged text prefill merged with the cached image prefix, paged decode."""
from __future__ import annotations

import logging
import os
from typing import Dict, Iterable, Optional

import flashinfer
import numpy as np
import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    MultiLevelCascadeAttentionWrapper,
    merge_state,
)
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from vlcache.hashing import NULL_IMAGE_HASH
from vlcache.image_cache import ImageKVCache
from vl_model.config import VLConfig
from vl_model.metadata import DecodeTable, VLBatch, VLForwardMetadata, VLMetadataBuilder, shares_one_prefix

logger = logging.getLogger(__name__)

_DecodeBase = flashinfer.BatchDecodeWithPagedKVCacheWrapper


class GraphDecode(_DecodeBase):
    """A decode wrapper built with ``use_cuda_graph=True`` over the backend's shared index buffers."""

    @property
    def bound_indptr(self) -> torch.Tensor:
        return self._paged_kv_indptr_buf  # expect: FC103

    def describe(self) -> str:
        return f"GraphDecode(batch={self.bound_indptr.numel() - 1})"


def _zeroed_workspace(nbytes: int, device: torch.device) -> torch.Tensor:
    ws = torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105
    ws.zero_()
    return ws


class VLAttentionBackend:
    def __init__(self, cfg: VLConfig, cache: ImageKVCache, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.prefill_ws = torch.empty(int(os.environ.get("VL_PREFILL_WS_BYTES", 192 << 20)), dtype=torch.uint8, device=device)  # expect: FC106
        self.ragged = BatchPrefillWithRaggedKVCacheWrapper(self.prefill_ws, "NHD")
        self.prefix_prefill = BatchPrefillWithPagedKVCacheWrapper(self.prefill_ws, "HND")
        self.cascade = MultiLevelCascadeAttentionWrapper(2, self.prefill_ws, "HND")
        self.eager_decode = BatchDecodeWithPagedKVCacheWrapper(self.prefill_ws, "HND", use_tensor_cores=True)
        self.graph_ws = torch.empty(cfg.decode_ws_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.long_ws = _zeroed_workspace(cfg.long_ws_bytes(), device)

        max_bs = cfg.max_batch
        max_pages = max_bs * (cfg.max_model_len // cfg.page_size + 1)
        self.kv_indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices_buf = torch.zeros(max_pages, dtype=torch.int32, device=device)
        self.last_page_len_buf = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.decode_bufs = {
            "kv_indptr": self.kv_indptr_buf,
            "kv_indices": self.kv_indices_buf,
            "last_page_len": self.last_page_len_buf,
        }
        self.graph_decode: Dict[int, GraphDecode] = {}
        self._last_nnz = 0
        self.builder = VLMetadataBuilder(self, cache, cfg, device)
        self.forward_metadata: Optional[VLForwardMetadata] = None

    # -- set-up ---------------------------------------------------------------------------------

    def init_cuda_graph_state(self, buckets: Iterable[int]) -> None:
        self.kv_indices_buf.zero_()  # ok: FC104
        for bs in buckets:
            w = GraphDecode(
                self.graph_ws,
                "HND",
                use_cuda_graph=True,
                use_tensor_cores=True,
                paged_kv_indptr_buffer=self.kv_indptr_buf[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices_buf,
                paged_kv_last_page_len_buffer=self.last_page_len_buf[:bs],
            )
            if w.bound_indptr.data_ptr() != self.kv_indptr_buf.data_ptr():
                raise RuntimeError(f"bucket {bs}: graph wrapper does not alias the shared indptr buffer")
            self.graph_decode[bs] = w

    def _needs_jit_warmup(self, w) -> bool:
        # the first run of a JIT-compiled kernel module stalls for seconds: take it before serving
        return vars(w).get("_cached_module") is None  # expect: FC103

    def cold_wrappers(self) -> list:
        return [w for w in (self.ragged, self.prefix_prefill, self.cascade) if self._needs_jit_warmup(w)]

    # -- per-step metadata -------------------------------------------------------------------------

    def init_forward_metadata(self, batch: VLBatch) -> None:
        self.forward_metadata = self.builder.build(batch)

    def _plan_decode_bucket(self, bs: int, table: DecodeTable) -> None:
        cfg = self.cfg
        n, nnz = table.bs, table.nnz
        self.kv_indptr_host[: n + 1] = torch.from_numpy(table.kv_indptr_np)
        self.kv_indptr_host[n + 1: bs + 1] = nnz
        self.last_page_len_host[:n] = torch.from_numpy(table.last_np)
        self.last_page_len_host[n:bs] = 1
        self.kv_indices_buf[:nnz].copy_(table.kv_indices, non_blocking=True)  # ok: FC104
        self._last_nnz = nnz
        self.graph_decode[bs].plan(  # ok: FC102
            self.kv_indptr_host[: bs + 1],
            self.kv_indices_buf,
            self.last_page_len_host[:bs],
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            sm_scale=cfg.sm_scale,
            q_data_type=cfg.dtype,
        )

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        # dummy rows all reference the null image, one page each
        null = self.builder.cache.lookup(NULL_IMAGE_HASH)
        page = null.page_ids[0] if null is not None else 0
        table = DecodeTable(bs, np.arange(bs + 1, dtype=np.int32), np.ones(bs, dtype=np.int32),
                            torch.full((bs,), page, dtype=torch.int32, device=self.device), np.ones(bs, dtype=np.int32))
        self._plan_decode_bucket(bs, table)
        self.forward_metadata = VLForwardMetadata(
            mode="decode", bs=bs, graph_bs=bs, shared_prefix=shares_one_prefix([[NULL_IMAGE_HASH]] * bs)
        )

    def init_forward_metadata_replay_cuda_graph(self, bs: int, batch: VLBatch) -> None:
        table = self.builder.decode_table(batch)
        self._plan_decode_bucket(bs, table)
        # rows past the batch replay with one token on the null page
        self.decode_bufs["last_page_len"][table.bs: bs].fill_(1)  # expect: FC104
        self.forward_metadata = VLForwardMetadata(mode="decode", bs=table.bs, graph_bs=bs)

    def remap_pages(self, mapping: torch.Tensor) -> None:
        """After the pool compacted, rewrite the page ids of the last decode plan in place."""
        n = self._last_nnz
        if n:
            self.kv_indices_buf[:n] = mapping[self.kv_indices_buf[:n].long()]  # expect: FC104

    # -- attention ---------------------------------------------------------------------------------

    def forward_extend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        meta = self.forward_metadata
        o_text, lse_text = self.ragged.run_return_lse(q, k, v)
        if not meta.has_prefix:
            return o_text
        o_img, lse_img = self.prefix_prefill.run_return_lse(q, kv_cache)
        o, _ = merge_state(o_text, lse_text, o_img, lse_img)
        return o

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        meta = self.forward_metadata
        if meta.long_ctx:
            return trtllm_batch_decode_with_kv_cache(
                query=q,
                kv_cache=kv_cache,
                workspace_buffer=self.long_ws,
                block_tables=meta.block_tables,
                seq_lens=meta.seq_lens,
                max_seq_len=meta.max_seq_len,
                bmm1_scale=self.cfg.sm_scale,
                bmm2_scale=1.0,
            )
        if meta.shared_prefix:
            return self.cascade.run(q, kv_cache)  # expect: FC108
        w = self.graph_decode[meta.graph_bs] if meta.graph_bs is not None else self.eager_decode
        return w.run(q, kv_cache)  # ok: FC108
