"""Paged decode attention: graph-mode wrappers per bucket, eager wrappers, trtllm-gen for long contexts."""
from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper as Decode
from flashinfer import CUDAGraphBatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from engine_rt.config import EngineConfig

logger = logging.getLogger(__name__)

_WS_TIERS = {"eager": 128 << 20, "graph": 256 << 20}


@functools.lru_cache(maxsize=None)
def trtllm_workspace(nbytes: int, device_index: int) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", device_index))  # expect: FC105


def describe_wrapper(w) -> str:
    return f"{type(w).__name__}(backend={w._backend})"  # expect: FC103


@dataclass
class GraphBuffers:
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len: torch.Tensor
    kv_indptr_host: torch.Tensor
    last_page_len_host: torch.Tensor

    @classmethod
    def allocate(cls, max_bs: int, max_pages: int, device: torch.device) -> "GraphBuffers":
        return cls(
            kv_indptr=torch.zeros(max_bs + 1, dtype=torch.int32, device=device),
            kv_indices=torch.zeros(max_pages, dtype=torch.int32, device=device),
            last_page_len=torch.ones(max_bs, dtype=torch.int32, device=device),
            kv_indptr_host=torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True),
            last_page_len_host=torch.ones(max_bs, dtype=torch.int32, pin_memory=True),
        )


@dataclass
class DecodeBatch:
    size: int
    req_ids: List[int]
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len_cpu: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_np: np.ndarray
    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_pages: torch.Tensor
    slot_offsets: torch.Tensor
    block_tables: Optional[torch.Tensor] = None
    # pages handed to rows whose next token starts a page, and where they go in the page table
    next_page_pos_np: Optional[np.ndarray] = None
    next_page_ids_np: Optional[np.ndarray] = None

    @classmethod
    def dummy(cls, bs: int, device: torch.device) -> "DecodeBatch":
        ar = torch.arange(bs + 1, dtype=torch.int32)
        zeros = torch.zeros(bs, dtype=torch.int64, device=device)
        return cls(bs, list(range(bs)), ar, torch.zeros(bs, dtype=torch.int32, device=device),
                   torch.ones(bs, dtype=torch.int32), torch.ones(bs, dtype=torch.int32, device=device),
                   np.ones(bs, dtype=np.int32), zeros, zeros.clone(), zeros.clone(), zeros.clone())


class DecodeAttention:
    def __init__(self, cfg: EngineConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.graph_ws = torch.zeros(_WS_TIERS["graph"], dtype=torch.uint8, device=device)  # expect: FC106
        self.eager_ws = torch.zeros(cfg.eager_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC106
        self.softcap_ws = torch.empty(cfg.eager_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.decode = Decode(self.eager_ws, "HND", use_tensor_cores=True)
        self.softcap_decode = Decode(self.softcap_ws, "HND", use_tensor_cores=True)
        self.long_ws = trtllm_workspace(cfg.trtllm_ws_bytes(), device.index or 0)
        self.bufs = GraphBuffers.allocate(cfg.max_batch, cfg.max_pages_per_batch(), device)
        self.graph_wrappers: Dict[int, CUDAGraphBatchDecodeWithPagedKVCacheWrapper] = {}
        logger.info("eager decode: %s", describe_wrapper(self.decode))

    def init_graph_wrappers(self, buckets: Iterable[int]) -> None:
        b = self.bufs
        for bs in buckets:
            self.graph_wrappers[bs] = CUDAGraphBatchDecodeWithPagedKVCacheWrapper(
                self.graph_ws, b.kv_indptr[: bs + 1], b.kv_indices, b.last_page_len[:bs], "HND", use_tensor_cores=True
            )

    def _plan_softcap(self, batch: DecodeBatch) -> None:
        cfg = self.cfg
        self.softcap_decode.plan(  # ok: FC102
            batch.kv_indptr_cpu,
            batch.kv_indices,
            batch.last_page_len_cpu,
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            logits_soft_cap=cfg.attn_softcap,
            sm_scale=cfg.sm_scale,
            q_data_type=cfg.dtype,
        )

    def plan_eager(self, batch: DecodeBatch) -> None:
        cfg = self.cfg
        last_page_len = (batch.seq_lens - 1) % cfg.page_size + 1
        self.decode.plan(  # expect: FC102
            batch.kv_indptr_cpu,
            batch.kv_indices,
            last_page_len,
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            sm_scale=cfg.sm_scale,
            q_data_type=cfg.dtype,
        )
        self._plan_softcap(batch)

    def replay_prepare(self, batch: DecodeBatch, bs: int) -> None:
        cfg, b = self.cfg, self.bufs
        n = batch.size
        nnz = int(batch.kv_indptr_cpu[n])
        b.kv_indptr_host[: n + 1].copy_(batch.kv_indptr_cpu)
        b.kv_indptr_host[n + 1: bs + 1] = nnz
        b.last_page_len_host[:n].copy_(batch.last_page_len_cpu)
        b.last_page_len_host[n:bs] = 1
        b.kv_indices[:nnz].copy_(batch.kv_indices[:nnz], non_blocking=True)  # ok: FC104
        self.graph_wrappers[bs].plan(
            b.kv_indptr_host[: bs + 1],
            b.kv_indices,
            b.last_page_len_host[:bs],
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            sm_scale=cfg.sm_scale,
            q_data_type=cfg.dtype,
        )
        self._plan_softcap(batch)

    def forward_graph(self, q: torch.Tensor, kv_cache: torch.Tensor, layer_id: int, bs: int) -> torch.Tensor:
        if self.cfg.is_softcap_layer(layer_id):
            return self.softcap_decode.run(q, kv_cache)  # expect: FC108
        return self.graph_wrappers[bs].run(q, kv_cache)  # ok: FC108

    def forward_eager(self, q: torch.Tensor, kv_cache: torch.Tensor, layer_id: int,
                      long_batch: Optional[DecodeBatch]) -> torch.Tensor:
        if long_batch is not None:
            return trtllm_batch_decode_with_kv_cache(
                query=q,
                kv_cache=kv_cache,
                workspace_buffer=self.long_ws,
                block_tables=long_batch.block_tables,
                seq_lens=long_batch.seq_lens,
                max_seq_len=int(long_batch.seq_lens_np.max()),
                bmm1_scale=self.cfg.sm_scale,
                bmm2_scale=1.0,
            )
        w = self.softcap_decode if self.cfg.is_softcap_layer(layer_id) else self.decode
        return w.run(q, kv_cache)
