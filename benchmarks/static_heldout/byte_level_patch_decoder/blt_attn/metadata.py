"""Per-step metadata of the global (patch-level) transformer."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from blt import ByteModelConfig, PatchBatch, byte_to_patch_index


@dataclass
class GlobalStepMeta:
    batch_size: int
    num_patches: int
    num_pages: int
    kv_indptr: torch.Tensor  # the builder's device copy
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor
    byte_indptr_cpu: torch.Tensor
    patch_indptr_cpu: torch.Tensor
    patch_index: torch.Tensor  # byte -> patch, on the device
    seq_of_patch: torch.Tensor
    use_tensor_cores: bool = False


class PatchPageTable:
    """Pages of the global KV cache, one list of pages per sequence slot."""

    def __init__(self, cfg: ByteModelConfig, device: torch.device) -> None:
        self.page_size = cfg.page_size
        self.table = torch.zeros(cfg.max_batch, cfg.max_patches_per_seq // cfg.page_size + 1,
                                 dtype=torch.int32, device=device)
        self.pages_cpu = [[] for _ in range(cfg.max_batch)]

    def gather_into(self, out: torch.Tensor, slots_cpu: torch.Tensor, indptr_cpu: torch.Tensor) -> int:
        pos = 0
        for i, slot in enumerate(slots_cpu.tolist()):
            n = int(indptr_cpu[i + 1] - indptr_cpu[i])
            out[pos : pos + n].copy_(self.table[slot, :n], non_blocking=True)
            pos += n
        return pos


class PatchMetadataBuilder:
    def __init__(self, cfg: ByteModelConfig, page_table: PatchPageTable, device: torch.device) -> None:
        self.cfg = cfg
        self.page_table = page_table
        self.device = device
        self._backend = "fa2"
        n = cfg.max_batch + 1
        self.kv_indptr_buf = torch.zeros(n, dtype=torch.int32, device=device)
        self.kv_indptr_pinned = torch.zeros(n, dtype=torch.int32, pin_memory=True)
        self.last_len_pinned = torch.zeros(cfg.max_batch, dtype=torch.int32, pin_memory=True)
        self.kv_indices_buf = torch.zeros(cfg.max_pages, dtype=torch.int32, device=device)
        self.byte_scratch: Optional[torch.Tensor] = None

    def build(self, batch: PatchBatch, slots_cpu: torch.Tensor, kv_lens_cpu: torch.Tensor) -> GlobalStepMeta:
        bs = batch.batch_size
        num_patches = int(batch.patches_per_seq_cpu.sum())  # ok: FC101
        if num_patches != batch.num_patches:
            raise RuntimeError(f"patch counts {batch.patches_per_seq} disagree with {batch.num_patches}")  # ok: FC101
        num_bytes = int(batch.patch_lens.sum())  # expect: FC101
        if num_bytes > self.cfg.max_bytes_per_step * self.cfg.max_patches_per_seq:
            raise ValueError(f"{num_bytes} bytes exceed the step budget")
        ps = self.cfg.page_size
        pages_per_seq = (kv_lens_cpu + ps - 1) // ps
        self.kv_indptr_pinned[1 : bs + 1] = torch.cumsum(pages_per_seq, 0)
        total_pages = int(self.kv_indptr_pinned[bs])
        if self.kv_indices_buf.numel() < total_pages:
            self.kv_indices_buf = torch.empty(2 * total_pages, dtype=torch.int32, device=self.device)  # expect: FC107
        if self.byte_scratch is None:
            self.byte_scratch = torch.empty(self.cfg.max_bytes_per_step, self.cfg.local_dim, device=self.device)  # ok: FC107
        self.page_table.gather_into(self.kv_indices_buf, slots_cpu, self.kv_indptr_pinned)
        self.kv_indptr_buf[: bs + 1].copy_(self.kv_indptr_pinned[: bs + 1], non_blocking=True)
        self.last_len_pinned[:bs] = kv_lens_cpu - (pages_per_seq - 1) * ps
        byte_indptr_cpu = torch.arange(bs + 1, dtype=torch.int32) * batch.bytes_per_seq
        patch_indptr_cpu = torch.zeros(bs + 1, dtype=torch.int32)
        patch_indptr_cpu[1:] = torch.cumsum(batch.patches_per_seq_cpu, 0)
        seq_ids = torch.arange(bs, device=self.device)
        return GlobalStepMeta(
            batch_size=bs,
            num_patches=num_patches,
            num_pages=total_pages,
            kv_indptr=self.kv_indptr_buf[: bs + 1],
            kv_indptr_cpu=self.kv_indptr_pinned[: bs + 1],
            kv_indices=self.kv_indices_buf[:total_pages],
            kv_last_page_len_cpu=self.last_len_pinned[:bs],
            byte_indptr_cpu=byte_indptr_cpu,
            patch_indptr_cpu=patch_indptr_cpu,
            patch_index=byte_to_patch_index(batch.patch_lens),
            seq_of_patch=torch.repeat_interleave(seq_ids, batch.patches_per_seq, output_size=num_patches),  # ok: FC101
            use_tensor_cores=self._backend != "fa2",  # ok: FC103
        )
