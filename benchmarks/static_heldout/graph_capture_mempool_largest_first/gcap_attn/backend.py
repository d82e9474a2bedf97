"""FlashInfer attention over the shared static buffers.

Decode buckets each get a graph-mode wrapper whose index buffers are prefixes of ``StaticIO``'s; verify steps use a
trtllm-gen paged prefill wrapper; batches larger than every bucket run an eager tensor-core decode wrapper, and
sequences past ``trtllm_min_seq_len`` in such batches go to the trtllm-gen decode kernel.
"""

from __future__ import annotations

import functools
import logging
from typing import Dict, Iterable

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from gcap.buckets import largest_first, padded_indptr, padded_last_page_len
from gcap.config import GraphConfig
from gcap.static_io import StaticIO
from gcap_attn.metadata import DecodeMeta
from gcap_attn.workspace import (
    eager_workspace,
    graph_workspace,
    trtllm_decode_workspace,
    trtllm_gen_prefill_workspace,
)

logger = logging.getLogger(__name__)


class GraphAttnBackend:
    def __init__(self, cfg: GraphConfig, io: StaticIO, kv_cache: torch.Tensor, device: torch.device) -> None:
        self.cfg = cfg
        self.io = io
        self.kv_cache = kv_cache  # [layers, pages, 2, kv_heads, page_size, head_dim]
        self.device = device
        self.sm_scale = cfg.head_dim**-0.5
        self.tokens_in_flight = 0

        self.graph_workspace = graph_workspace(device)
        self.eager_workspace = eager_workspace(cfg, device)
        self.trtllm_workspace = trtllm_decode_workspace(cfg.trtllm_workspace_bytes(), device.index or 0)
        self.verify_workspace = trtllm_gen_prefill_workspace(cfg.verify_workspace_bytes(), device)

        self.graph_decode: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.eager_decode = BatchDecodeWithPagedKVCacheWrapper(self.eager_workspace, "HND", use_tensor_cores=True)
        self.eager_kv_indptr = torch.zeros(cfg.eager_max_bs + 1, dtype=torch.int32, device=device)
        self.verify_prefill = BatchPrefillWithPagedKVCacheWrapper(self.verify_workspace, "HND", backend="trtllm-gen")
        self._plan_verify = functools.partial(
            self.verify_prefill.plan,
            num_qo_heads=cfg.num_qo_heads,
            num_kv_heads=cfg.num_kv_heads,
            head_dim_qk=cfg.head_dim,
            page_size=cfg.page_size,
            causal=True,
            q_data_type=cfg.dtype,
            kv_data_type=cfg.dtype,
        )

    def init_graph_wrappers(self, buckets: Iterable[int]) -> None:
        io = self.io
        for bs in largest_first(buckets):
            self.graph_decode[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace,
                "HND",
                use_cuda_graph=True,
                use_tensor_cores=True,
                paged_kv_indptr_buffer=io.kv_indptr[: bs + 1],
                paged_kv_indices_buffer=io.kv_indices,
                paged_kv_last_page_len_buffer=io.kv_last_page_len[:bs],
            )

    # ------------------------------------------------------------ per step

    def prepare_replay(self, bs: int, padded: int, meta: DecodeMeta) -> None:
        """Fill the bucket's bound buffers for ``bs`` live rows padded to ``padded``, then plan."""
        cfg, io = self.cfg, self.io
        lens_cpu = meta.seq_lens_cpu[:bs]
        self.tokens_in_flight = int(lens_cpu.sum())  # ok: FC101
        # rows the sampler already finished on the device must not write the cache
        finished = meta.seq_lens == 0
        finished_rows = meta.row_ids[finished]  # expect: FC101
        io.out_loc.index_fill_(0, finished_rows, 0)

        lens = lens_cpu.numpy()
        pages = (lens + cfg.page_size - 1) // cfg.page_size
        indptr = padded_indptr(pages, padded)
        last = padded_last_page_len(lens, padded, cfg.page_size)
        tail = [np.zeros(padded - bs, dtype=np.int32)]
        flat = np.concatenate([meta.page_lists[i][: pages[i]] for i in range(bs)] + tail).astype(np.int32)
        n = int(indptr[-1])

        io.kv_indptr_host[: padded + 1].copy_(torch.from_numpy(indptr))
        io.kv_last_page_len_host[:padded].copy_(torch.from_numpy(last))
        io.kv_indices[:n].copy_(torch.from_numpy(flat), non_blocking=True)  # ok: FC104
        io.kv_indptr[: padded + 1].copy_(io.kv_indptr_host[: padded + 1], non_blocking=True)
        io.kv_last_page_len[:padded].copy_(io.kv_last_page_len_host[:padded], non_blocking=True)
        self.graph_decode[padded].plan(  # ok: FC102
            io.kv_indptr_host[: padded + 1],
            io.kv_indices[:n],
            io.kv_last_page_len_host[:padded],
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            q_data_type=cfg.dtype,
            kv_data_type=cfg.dtype,
        )
        meta.graph_bs = padded

    def prepare_eager(self, bs: int, meta: DecodeMeta) -> None:
        cfg = self.cfg
        if bs > cfg.eager_max_bs:
            raise ValueError(f"eager decode supports up to {cfg.eager_max_bs} sequences, got {bs}")
        pages_dev = (meta.seq_lens + cfg.page_size - 1) // cfg.page_size
        torch.cumsum(pages_dev, 0, dtype=torch.int32, out=self.eager_kv_indptr[1 : bs + 1])
        self.eager_decode.plan(  # expect: FC102
            self.eager_kv_indptr[: bs + 1],
            meta.kv_indices,
            meta.kv_last_page_len_host,
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            q_data_type=cfg.dtype,
            kv_data_type=cfg.dtype,
        )
        meta.graph_bs = None

    def prepare_verify(self, bs: int, meta: DecodeMeta) -> None:
        self._plan_verify(  # ok: FC102
            meta.qo_indptr_host[: bs + 1],
            meta.kv_indptr_host[: bs + 1],
            meta.kv_indices,
            meta.kv_last_page_len_host[:bs],
        )

    # ------------------------------------------------------------- kernels

    def store_kv(self, layer_id: int, k: torch.Tensor, v: torch.Tensor, out_loc: torch.Tensor) -> None:
        kv = self.kv_cache[layer_id]
        page, slot = out_loc // self.cfg.page_size, out_loc % self.cfg.page_size
        kv[page, 0, :, slot, :] = k
        kv[page, 1, :, slot, :] = v

    def decode_attention(self, q: torch.Tensor, layer_id: int, meta: DecodeMeta) -> torch.Tensor:
        kv = self.kv_cache[layer_id]
        if meta.graph_bs is None and meta.max_seq_len >= self.cfg.trtllm_min_seq_len:
            return trtllm_batch_decode_with_kv_cache(
                q,
                kv,
                self.trtllm_workspace,
                meta.block_table,
                meta.seq_lens,
                meta.max_seq_len,
                bmm1_scale=self.sm_scale,
                bmm2_scale=1.0,
            )
        w = self.graph_decode[meta.graph_bs] if meta.graph_bs is not None else self.eager_decode
        return w.run(q, kv)  # ok: FC108

    def verify_attention(self, q: torch.Tensor, layer_id: int, meta: DecodeMeta) -> torch.Tensor:
        return self.verify_prefill.run(q, self.kv_cache[layer_id])  # expect: FC108
