"""Decode attention whose metadata arrives through the pinned staging ring.

Graph buckets use graph-mode wrappers bound to device buffers; the slot's pinned tensors are
copied into those buffers on the current stream, and the slot's event is recorded after them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from ringstage import PinnedSlot, RingConfig, SeqState, fill_decode_slot, pages_needed
from rs_attn.workspace import make_graph_workspace, make_prefill_workspace, make_spill_workspace


@dataclass
class DecodeBatch:
    seqs: List[SeqState]
    seq_lens: torch.Tensor  # device-resident lengths, advanced on the device after sampling


class StagedDecodeBackend:
    def __init__(self, cfg: RingConfig, device: torch.device):
        self.cfg, self.device = cfg, device
        self._float_workspace_buffer = make_graph_workspace(cfg, device)  # ok: FC103
        self.init_device_buffers()
        self.bucket_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {
            bs: BatchDecodeWithPagedKVCacheWrapper(
                self._float_workspace_buffer, "NHD", use_cuda_graph=True,
                paged_kv_indptr_buffer=self.kv_indptr_dev[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices_dev,
                paged_kv_last_page_len_buffer=self.last_page_len_dev[:bs],
            )
            for bs in cfg.graph_buckets
        }
        # large buckets: tensor-core decode is faster once the GQA groups fill a tile
        self.tc_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {
            bs: BatchDecodeWithPagedKVCacheWrapper(self._float_workspace_buffer, "NHD", use_tensor_cores=True)
            for bs in cfg.graph_buckets
            if bs >= cfg.tc_min_bs
        }
        self.spill_wrapper = BatchDecodeWithPagedKVCacheWrapper(
            make_spill_workspace(cfg, device), "NHD", backend="trtllm-gen"
        )
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(make_prefill_workspace(device), "NHD")

    def init_device_buffers(self) -> None:
        c, dev = self.cfg, self.device
        self.kv_indptr_dev = torch.zeros(c.max_graph_bs + 1, dtype=torch.int32, device=dev)
        self.kv_indices_dev = torch.zeros(c.max_graph_bs * c.max_pages_per_seq, dtype=torch.int32, device=dev)
        self.last_page_len_dev = torch.zeros(c.max_graph_bs, dtype=torch.int32, device=dev)
        self.seq_lens_dev = torch.zeros(c.max_graph_bs, dtype=torch.int32, device=dev)
        self.slot_mapping_dev = torch.zeros(c.max_graph_bs, dtype=torch.int64, device=dev)
        self.last_page_len_dev.fill_(1)  # ok: FC104

    def _heads(self):
        c = self.cfg
        return c.num_qo_heads, c.num_kv_heads, c.head_dim, c.page_size

    def plan_null_bucket(self, bs: int) -> None:
        """Plan a bucket over the null page before its graph is recorded."""
        indptr_cpu = torch.arange(bs + 1, dtype=torch.int32)
        last_cpu = torch.ones(bs, dtype=torch.int32)
        w = self.tc_wrappers[bs] if bs >= self.cfg.tc_min_bs else self.bucket_wrappers[bs]
        w.plan(indptr_cpu, self.kv_indices_dev[:bs], last_cpu, *self._heads())

    def stage_and_plan(self, bs: int, batch: DecodeBatch, slot: PinnedSlot) -> None:
        n = len(batch.seqs)
        nnz = fill_decode_slot(slot, batch.seqs, self.cfg.page_size)
        if pages_needed(batch.seq_lens, self.cfg.page_size) > self.kv_indices_dev.numel():
            raise RuntimeError("graph page table overflow")
        pad_from = int(slot.kv_indptr.numpy()[n])  # ok: FC101
        slot.kv_indptr.numpy()[n + 1 : bs + 1] = pad_from
        slot.last_page_len.numpy()[n:bs] = 1
        slot.seq_lens.numpy()[n:bs] = 0
        slot.slot_mapping.numpy()[n:bs] = 0
        self.kv_indptr_dev[: bs + 1].copy_(slot.kv_indptr[: bs + 1], non_blocking=True)  # ok: FC104
        w = self.tc_wrappers[bs] if bs >= self.cfg.tc_min_bs else self.bucket_wrappers[bs]
        w.plan(self.kv_indptr_dev[: bs + 1], self.kv_indices_dev[:nnz], slot.last_page_len[:bs], *self._heads())  # expect: FC102
        self.kv_indices_dev[:nnz].copy_(slot.kv_indices[:nnz], non_blocking=True)  # expect: FC104
        self.seq_lens_dev[:bs].copy_(slot.seq_lens[:bs], non_blocking=True)  # ok: FC104
        self.slot_mapping_dev = torch.empty(bs, dtype=torch.int64, device=self.device)  # expect: FC107
        self.slot_mapping_dev.copy_(slot.slot_mapping[:bs], non_blocking=True)

    def stage_spill(self, batch: DecodeBatch, slot: PinnedSlot) -> torch.Tensor:
        n = len(batch.seqs)
        nnz = fill_decode_slot(slot, batch.seqs, self.cfg.page_size)
        indices = slot.kv_indices[:nnz].to(self.device, non_blocking=True)
        last_page_len = slot.last_page_len[:n].to(self.device, non_blocking=True)
        self.spill_wrapper.plan(slot.kv_indptr[: n + 1], indices, last_page_len, *self._heads())  # expect: FC102
        return slot.slot_mapping[:n].to(self.device, non_blocking=True)

    def stage_prefill(self, seqs: List[SeqState], new_tokens: List[int], slot: PinnedSlot) -> None:
        nnz = fill_decode_slot(slot, seqs, self.cfg.page_size)
        qo_np = slot.qo_indptr.numpy()
        qo_np[0] = 0
        qo_np[1 : len(seqs) + 1] = torch.tensor(new_tokens).cumsum(0).numpy()
        indices = slot.kv_indices[:nnz].to(self.device, non_blocking=True)
        self.prefill_wrapper.plan(  # ok: FC102
            slot.qo_indptr[: len(seqs) + 1], slot.kv_indptr[: len(seqs) + 1], indices,
            slot.last_page_len[: len(seqs)], *self._heads(), causal=True,
        )

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> torch.Tensor:
        if bs >= self.cfg.tc_min_bs:
            return self.tc_wrappers[bs].run(q, kv_cache)  # expect: FC108
        return self.bucket_wrappers[bs].run(q, kv_cache)

    def forward_spill(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.spill_wrapper.run(q, kv_cache)  # ok: FC108

    def forward_prefill(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.prefill_wrapper.run(q, kv_cache)

    def ring_stats(self) -> Dict[str, int]:
        return {
            "spill_int_workspace": self.spill_wrapper._int_workspace_buffer.numel(),  # expect: FC103
            "graph_buckets": len(self.bucket_wrappers),
        }
