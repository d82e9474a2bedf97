"""FlashInfer attention for the structured-output server.

Prompts run through an eager paged prefill wrapper (trtllm-gen context kernel on Blackwell); jump-forward
tokens run as a small extend through their own prefill wrapper; decode batches replay a graph per bucket over
graph-mode decode wrappers, and batches above the largest bucket decode eagerly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Tuple

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache
from flashinfer.prefill import trtllm_batch_context_with_kv_cache

from gbserve.config import GBConfig, WsTier

_CTX_WORKSPACES: Dict[int, torch.Tensor] = {}


def get_context_workspace(device: torch.device, nbytes: int) -> torch.Tensor:
    """One context workspace per size, shared by every prefill on this device."""
    ws = _CTX_WORKSPACES.get(nbytes)
    if ws is None:
        ws = torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105
        _CTX_WORKSPACES[nbytes] = ws
    return ws


def _wrapper_summary(w) -> str:
    return f"{type(w).__name__}(backend={w._backend}, layout={w._kv_layout})"  # expect: FC103


@dataclass
class PrefillBatch:
    num_reqs: int
    extend_lens_np: np.ndarray
    seq_lens_np: np.ndarray
    kv_indptr_np: np.ndarray
    kv_indices_np: np.ndarray
    last_page_len_np: np.ndarray
    slot_mapping_np: np.ndarray
    block_tables_np: np.ndarray


@dataclass
class DecodeBatch:
    num_reqs: int
    seq_lens_np: np.ndarray
    kv_indptr_np: np.ndarray
    kv_indices_np: np.ndarray
    last_page_len_np: np.ndarray
    slot_mapping_np: np.ndarray
    block_tables_np: np.ndarray


class TrtllmDecode:
    """Blackwell eager decode: the same ``run(q, kv_cache)`` as a decode wrapper, over the step's block tables."""

    def __init__(self, backend: "GBAttnBackend", batch: DecodeBatch):
        self.backend = backend
        self.batch = batch

    def run(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.backend.forward_decode_trtllm(q, kv_cache, self.batch)


class GBAttnBackend:
    def __init__(self, cfg: GBConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self._kv_layout = cfg.kv_layout  # ok: FC103
        max_bs = cfg.max_batch_size

        self.graph_workspace = torch.zeros(WsTier.DECODE.nbytes(), dtype=torch.uint8, device=device)  # expect: FC106
        self.prefill_workspace = torch.zeros(cfg.prefill_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC106
        self.jump_workspace = torch.zeros(cfg.prefill_workspace_bytes(), dtype=torch.uint8, device=device)
        self.decode_workspace = torch.empty(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=device)
        self.trtllm_decode_workspace = self._alloc_trtllm_decode_workspace() if cfg.use_trtllm else None

        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(cfg.num_pages, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.slot_mapping = torch.zeros(cfg.max_prefill_tokens, dtype=torch.int64, device=device)
        self.kv_caches = [
            torch.zeros(cfg.num_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim, dtype=cfg.dtype, device=device)
            for _ in range(cfg.num_layers)
        ]

        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {
            bs: BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace, self._kv_layout, use_cuda_graph=True,
                paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
            )
            for bs in cfg.graph_buckets
        }
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, self._kv_layout)
        self.jump_prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.jump_workspace, self._kv_layout)
        self.eager_decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.decode_workspace, self._kv_layout)
        self.init_graph_buffers()

    def _alloc_trtllm_decode_workspace(self) -> torch.Tensor:
        ws = torch.empty(self.cfg.decode_workspace_bytes(), dtype=torch.uint8, device=self.device)  # ok: FC105
        ws.zero_()
        return ws

    def init_graph_buffers(self) -> None:
        self.kv_last_page_len.fill_(1)  # ok: FC104

    def describe(self) -> Dict[str, str]:
        info = {f"decode[{bs}]": _wrapper_summary(w) for bs, w in self.graph_wrappers.items()}
        info["prefill"] = _wrapper_summary(self.prefill_wrapper)
        return info

    def _heads(self) -> Tuple[int, int, int, int]:
        return self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim, self.cfg.page_size

    def plan_prefill(self, batch: PrefillBatch) -> None:
        n = int(batch.extend_lens_np.sum())
        self.slot_mapping[:n].copy_(torch.from_numpy(batch.slot_mapping_np), non_blocking=True)
        if self.cfg.use_trtllm:
            return  # the trtllm-gen context kernel takes block tables, no plan
        extend_lens = torch.from_numpy(batch.extend_lens_np).to(self.device, non_blocking=True)
        qo_indptr = torch.zeros(batch.num_reqs + 1, dtype=torch.int32, device=self.device)
        torch.cumsum(extend_lens, dim=0, out=qo_indptr[1:])
        self.prefill_wrapper.plan(  # expect: FC102
            qo_indptr,
            torch.from_numpy(batch.kv_indptr_np),
            torch.from_numpy(batch.kv_indices_np).to(self.device, non_blocking=True),
            torch.from_numpy(batch.last_page_len_np),
            *self._heads(),
            causal=True,
            q_data_type=self.cfg.dtype,
        )

    def plan_jump_extend(self, batch: PrefillBatch) -> None:
        n = int(batch.extend_lens_np.sum())
        self.slot_mapping[:n].copy_(torch.from_numpy(batch.slot_mapping_np), non_blocking=True)
        qo_indptr_cpu = torch.zeros(batch.num_reqs + 1, dtype=torch.int32)
        torch.cumsum(torch.from_numpy(batch.extend_lens_np), dim=0, out=qo_indptr_cpu[1:])
        indices = torch.from_numpy(batch.kv_indices_np).to(self.device, non_blocking=True)
        self.jump_prefill_wrapper.plan(
            qo_indptr_cpu, torch.from_numpy(batch.kv_indptr_np), indices, torch.from_numpy(batch.last_page_len_np),
            *self._heads(), causal=True, q_data_type=self.cfg.dtype,
        )

    def forward_prefill(self, q: torch.Tensor, kv_cache: torch.Tensor, batch: PrefillBatch) -> torch.Tensor:
        if not self.cfg.use_trtllm:
            return self.prefill_wrapper.run(q, kv_cache)
        ws = get_context_workspace(self.device, self.cfg.prefill_workspace_bytes())
        cum_q = np.zeros(batch.num_reqs + 1, dtype=np.int32)
        np.cumsum(batch.extend_lens_np, out=cum_q[1:])
        cum_kv = np.zeros(batch.num_reqs + 1, dtype=np.int32)
        np.cumsum(batch.seq_lens_np, out=cum_kv[1:])
        return trtllm_batch_context_with_kv_cache(
            q,
            kv_cache,
            ws,
            torch.from_numpy(batch.block_tables_np).to(self.device, non_blocking=True),
            torch.from_numpy(batch.seq_lens_np).to(self.device, non_blocking=True),
            max_q_len=int(batch.extend_lens_np.max()),
            max_kv_len=int(batch.seq_lens_np.max()),
            bmm1_scale=self.cfg.head_dim**-0.5,
            bmm2_scale=1.0,
            batch_size=batch.num_reqs,
            cum_seq_lens_q=torch.from_numpy(cum_q).to(self.device, non_blocking=True),
            cum_seq_lens_kv=torch.from_numpy(cum_kv).to(self.device, non_blocking=True),
        )

    def warm_plan(self, bs: int) -> None:
        """Plans a bucket with one page per row before it is captured."""
        self.kv_indptr_cpu[: bs + 1].copy_(torch.arange(bs + 1, dtype=torch.int32))
        self.kv_last_page_len_cpu[:bs].fill_(1)
        self.graph_wrappers[bs].plan(
            self.kv_indptr_cpu[: bs + 1], self.kv_indices[:bs], self.kv_last_page_len_cpu[:bs],
            *self._heads(), q_data_type=self.cfg.dtype,
        )

    def load_decode_inputs(self, bs: int, padded: int, batch: DecodeBatch) -> None:
        n = len(batch.kv_indices_np)
        self.kv_indptr_cpu[: bs + 1].copy_(torch.from_numpy(batch.kv_indptr_np))
        self.kv_indptr_cpu[bs + 1 : padded + 1] = n
        self.kv_last_page_len_cpu[:bs].copy_(torch.from_numpy(batch.last_page_len_np))
        self.kv_last_page_len_cpu[bs:padded] = 1
        self.kv_indices[:n].copy_(torch.from_numpy(batch.kv_indices_np).to(self.device, non_blocking=True))  # ok: FC104
        self.slot_mapping[:bs].copy_(torch.from_numpy(batch.slot_mapping_np), non_blocking=True)
        self.graph_wrappers[padded].plan(  # ok: FC102
            self.kv_indptr_cpu[: padded + 1],
            self.kv_indices[:n],
            self.kv_last_page_len_cpu[:padded],
            *self._heads(),
            q_data_type=self.cfg.dtype,
        )

    def plan_eager_decode(self, batch: DecodeBatch) -> None:
        bs = batch.num_reqs
        self.slot_mapping[:bs].copy_(torch.from_numpy(batch.slot_mapping_np), non_blocking=True)
        if self.cfg.use_trtllm:
            return
        indices = torch.from_numpy(batch.kv_indices_np).to(self.device, non_blocking=True)
        self.eager_decode_wrapper.plan(
            torch.from_numpy(batch.kv_indptr_np), indices, torch.from_numpy(batch.last_page_len_np),
            *self._heads(), q_data_type=self.cfg.dtype,
        )

    def forward_decode_trtllm(self, q: torch.Tensor, kv_cache: torch.Tensor, batch: DecodeBatch) -> torch.Tensor:
        return trtllm_batch_decode_with_kv_cache(
            q,
            kv_cache,
            self.trtllm_decode_workspace,
            torch.from_numpy(batch.block_tables_np).to(self.device, non_blocking=True),
            torch.from_numpy(batch.seq_lens_np).to(self.device, non_blocking=True),
            int(batch.seq_lens_np.max()),
            bmm1_scale=self.cfg.head_dim**-0.5,
            bmm2_scale=1.0,
        )

    def store_kv(self, kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        flat = kv_cache.transpose(0, 1).flatten(1, 2)
        slots = self.slot_mapping[: k.shape[0]]
        flat[0].index_copy_(0, slots, k)
        flat[1].index_copy_(0, slots, v)
