"""FlashInfer attention for the global transformer over patches."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Dict, Optional

import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
)

from blt import XATTN_WORKSPACE_BYTES, ByteModelConfig, PatchBatch, cu_patches

from .metadata import GlobalStepMeta, PatchMetadataBuilder, PatchPageTable
from .workspace import make_workspace, zeroed_workspace

DecodeWrapper = BatchDecodeWithPagedKVCacheWrapper


@dataclass
class ForwardMeta:
    """What the captured forward of one bucket reads."""

    bs: int
    kv_indptr: torch.Tensor
    patch_index: torch.Tensor


class GlobalAttentionBackend:
    def __init__(self, cfg: ByteModelConfig, page_table: PatchPageTable, device: torch.device) -> None:
        self.cfg = cfg
        self.device = device
        self.builder = PatchMetadataBuilder(cfg, page_table, device)
        self.graph_workspace = torch.zeros(cfg.decode_workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        self.xattn_workspace = torch.empty(XATTN_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        mb = cfg.max_batch
        self.kv_indptr = torch.zeros(mb + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(cfg.max_pages, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(mb, dtype=torch.int32, device=device)
        self.decode_wrappers: Dict[int, DecodeWrapper] = {}
        for bs in cfg.patch_buckets:
            self.decode_wrappers[bs] = DecodeWrapper(
                self.graph_workspace,
                "NHD",
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
            )
        self.eager_decode = DecodeWrapper(
            make_workspace(cfg.prefill_workspace_bytes(), device),
            "NHD",
            backend="trtllm-gen" if cfg.use_trtllm_eager else "fa2",
        )
        self.prefill = BatchPrefillWithPagedKVCacheWrapper(
            zeroed_workspace(cfg.prefill_workspace_bytes(), device), "NHD", backend="trtllm-gen"
        )
        self.xattn = BatchPrefillWithRaggedKVCacheWrapper(self.xattn_workspace, "NHD")
        self._plan_prefill = functools.partial(
            self.prefill.plan,
            num_qo_heads=cfg.num_qo_heads,
            num_kv_heads=cfg.num_kv_heads,
            head_dim_qk=cfg.head_dim,
            page_size=cfg.page_size,
            causal=True,
        )
        self.active_bs = 0
        self.forward_meta: Optional[ForwardMeta] = None

    def init_cuda_graph_state(self) -> None:
        self.kv_indptr.zero_()  # ok: FC104
        self.kv_last_page_len.fill_(1)

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        self.active_bs = bs
        indptr_cpu = torch.arange(bs + 1, dtype=torch.int32)
        last_cpu = torch.ones(bs, dtype=torch.int32)
        self.decode_wrappers[bs].plan(indptr_cpu, self.kv_indices[:bs], last_cpu, self.cfg.num_qo_heads,
                                      self.cfg.num_kv_heads, self.cfg.head_dim, self.cfg.page_size)
        dummy_index = torch.arange(bs, device=self.device).repeat_interleave(self.cfg.max_patch_len)
        self.forward_meta = ForwardMeta(bs=bs, kv_indptr=self.kv_indptr[: bs + 1], patch_index=dummy_index)

    def check_layouts(self) -> None:
        for bs, w in self.decode_wrappers.items():
            if w._kv_layout != "NHD":  # expect: FC103
                raise RuntimeError(f"bucket {bs} wrapper is not NHD")

    def init_forward_metadata(self, batch: PatchBatch, slots_cpu: torch.Tensor, kv_lens_cpu: torch.Tensor) -> GlobalStepMeta:
        meta = self.builder.build(batch, slots_cpu, kv_lens_cpu)
        bs = meta.batch_size
        self.active_bs = bs
        self.xattn.plan(meta.byte_indptr_cpu, meta.patch_indptr_cpu,  # ok: FC102
                        self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim, causal=False)
        if bs in self.decode_wrappers:
            self.kv_indptr[: bs + 1].copy_(meta.kv_indptr_cpu, non_blocking=True)  # ok: FC104
            self.kv_indices[: meta.num_pages].copy_(meta.kv_indices, non_blocking=True)
            self.plan_bucket(bs, meta)
            self.kv_last_page_len[:bs].copy_(meta.kv_last_page_len_cpu, non_blocking=True)  # expect: FC104
        else:
            self.eager_decode.plan(meta.kv_indptr_cpu, meta.kv_indices, meta.kv_last_page_len_cpu,  # ok: FC102
                                   self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim,
                                   self.cfg.page_size)
        self.forward_meta = ForwardMeta(bs=bs, kv_indptr=self.kv_indptr[: bs + 1], patch_index=meta.patch_index)
        return meta

    def plan_bucket(self, bs: int, meta: GlobalStepMeta) -> None:
        w = self.decode_wrappers[bs]
        w.plan(meta.kv_indptr, meta.kv_indices, meta.kv_last_page_len_cpu,  # expect: FC102
               self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim, self.cfg.page_size,
               use_tensor_cores=meta.use_tensor_cores)

    def plan_prefill(self, batch: PatchBatch, kv_indptr_cpu: torch.Tensor, kv_indices: torch.Tensor,
                     last_len_cpu: torch.Tensor) -> None:
        qo_indptr = cu_patches(batch.patches_per_seq)
        self._plan_prefill(qo_indptr, kv_indptr_cpu, kv_indices, last_len_cpu)  # expect: FC102

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        w = self.decode_wrappers[self.active_bs] if self.active_bs in self.decode_wrappers else self.eager_decode
        return w.run(q, kv_cache)  # ok: FC108

    def forward_prefill(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.prefill.run(q, kv_cache)

    def cross_attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.xattn.run(q, k, v)  # expect: FC108
