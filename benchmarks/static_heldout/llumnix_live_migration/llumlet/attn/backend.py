"""FlashInfer decode for one instance: graph-mode wrappers per bucket, an eager wrapper above the largest
bucket, a soft-capped wrapper for the model's capped layers, a paged prefill for new prompts and for
the tail of migrated requests that the destination recomputes instead of receiving."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from llumlet.config import GRAPH_WORKSPACE_BYTES, InstanceConfig


@dataclass
class DecodeBatch:
    rids: list
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor  # device
    seq_lens_cpu: torch.Tensor  # pinned
    slot_mapping: torch.Tensor
    kv_indptr_cpu: torch.Tensor  # pinned
    kv_indices: torch.Tensor  # device
    kv_last_page_len_cpu: torch.Tensor  # pinned
    kv_last_page_len_gpu: torch.Tensor  # device, read by the KV write kernel


@dataclass
class DecodeMeta:
    wrapper: Any
    slot_mapping: torch.Tensor


class InstanceAttnBackend:
    def __init__(self, cfg: InstanceConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self._kv_layout = "NHD"
        self.num_qo_heads = cfg.num_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        tensor_cores = cfg.num_heads // cfg.num_kv_heads >= 4

        self.prefill_workspace = torch.zeros(cfg.prefill_workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, self._kv_layout)

        kw = {"use_tensor_cores": tensor_cores}
        if cfg.sm_version >= 100:
            kw["backend"] = "trtllm-gen"
        dec_bytes = cfg.max_num_seqs * cfg.num_heads * cfg.head_dim * 4 * 16 + (32 << 20)
        self.eager_workspace = torch.empty(dec_bytes, dtype=torch.uint8, device=device)  # expect: FC105
        self.eager_decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.eager_workspace, self._kv_layout, **kw)
        self.softcap_decode_wrapper = (
            BatchDecodeWithPagedKVCacheWrapper(self.eager_workspace, self._kv_layout) if cfg.logits_soft_cap else None
        )

        tail_bytes = cfg.block_size * cfg.max_num_seqs * cfg.num_heads * cfg.head_dim * 4 + (8 << 20)
        self.tail_workspace = torch.empty(tail_bytes, dtype=torch.uint8, device=device)  # ok: FC105
        self.tail_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.tail_workspace, self._kv_layout)
        self.graph_wrappers: dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}

    def init_graph_buffers(self) -> None:
        cfg = self.cfg
        max_bs = max(cfg.graph_buckets)
        self.graph_workspace = torch.zeros(GRAPH_WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)  # expect: FC106
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.kv_indices = torch.zeros(cfg.num_blocks, dtype=torch.int32, device=self.device)
        self.kv_last_page_len = torch.empty(max_bs, dtype=torch.int32, device=self.device)
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        for bs in cfg.graph_buckets:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace,
                self._kv_layout,
                use_cuda_graph=True,
                use_tensor_cores=cfg.num_heads // cfg.num_kv_heads >= 4,
                paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
            )
        self.kv_last_page_len.fill_(1)

    def layout(self) -> str:
        return self._kv_layout  # ok: FC103

    def _plan_softcap(self, indptr_cpu, indices, last_cpu) -> None:
        if self.softcap_decode_wrapper is not None:
            self.softcap_decode_wrapper.plan(
                indptr_cpu,
                indices,
                last_cpu,
                self.num_qo_heads,
                self.num_kv_heads,
                self.head_dim,
                self.cfg.block_size,
                logits_soft_cap=self.cfg.logits_soft_cap,
            )

    def capture_metadata(self, bs: int, seq_lens_cpu: torch.Tensor, slot_mapping: torch.Tensor) -> DecodeMeta:
        pages = (seq_lens_cpu + self.cfg.block_size - 1) // self.cfg.block_size
        indptr_cpu = torch.zeros(bs + 1, dtype=torch.int32)
        indptr_cpu[1:] = torch.cumsum(pages, 0)
        last_cpu = (seq_lens_cpu - 1) % self.cfg.block_size + 1
        w = self.graph_wrappers[bs]
        w.plan(indptr_cpu, self.kv_indices, last_cpu, self.num_qo_heads, self.num_kv_heads, self.head_dim, self.cfg.block_size)
        self._plan_softcap(indptr_cpu, self.kv_indices, last_cpu)
        return DecodeMeta(wrapper=w, slot_mapping=slot_mapping)

    def plan_decode(self, batch: DecodeBatch) -> DecodeMeta:
        """Eager decode for batches above the largest captured bucket."""
        self.eager_decode_wrapper.plan(  # expect: FC102
            batch.kv_indptr_cpu,
            batch.kv_indices,
            batch.kv_last_page_len_gpu,
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            self.cfg.block_size,
        )
        self._plan_softcap(batch.kv_indptr_cpu, batch.kv_indices, batch.kv_last_page_len_cpu)
        return DecodeMeta(wrapper=self.eager_decode_wrapper, slot_mapping=batch.slot_mapping)

    def plan_tail(self, qo_indptr_cpu: torch.Tensor, kv_indptr_cpu: torch.Tensor, kv_indices, last_cpu) -> None:
        self.tail_wrapper.plan(
            qo_indptr_cpu,
            kv_indptr_cpu,
            kv_indices,
            last_cpu,
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            self.cfg.block_size,
            causal=True,
        )

    def prepare_replay(self, bs: int, batch: DecodeBatch) -> DecodeMeta:
        n = len(batch.rids)
        nnz = int(batch.kv_indptr_cpu[n])
        self.kv_indices[:nnz].copy_(batch.kv_indices, non_blocking=True)  # ok: FC104
        self.kv_indptr_cpu[: n + 1].copy_(batch.kv_indptr_cpu[: n + 1])
        self.kv_indptr_cpu[n + 1 : bs + 1] = nnz
        self.kv_last_page_len_cpu[:n].copy_(batch.kv_last_page_len_cpu[:n])
        self.kv_last_page_len_cpu[n:bs] = 1
        w = self.graph_wrappers[bs]
        w.plan(  # ok: FC102
            self.kv_indptr_cpu[: bs + 1],
            self.kv_indices,
            self.kv_last_page_len_cpu[:bs],
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            self.cfg.block_size,
        )
        self._plan_softcap(self.kv_indptr_cpu[: bs + 1], self.kv_indices, self.kv_last_page_len_cpu[:bs])
        return DecodeMeta(wrapper=w, slot_mapping=batch.slot_mapping)

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, meta: DecodeMeta, softcap: bool) -> torch.Tensor:
        if softcap:
            return self.softcap_decode_wrapper.run(q, kv_cache)  # expect: FC108
        return meta.wrapper.run(q, kv_cache)  # ok: FC108

    def forward_tail(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.tail_wrapper.run(q, kv_cache)
