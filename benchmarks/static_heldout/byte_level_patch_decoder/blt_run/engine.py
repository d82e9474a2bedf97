"""The byte-level serving engine."""
from __future__ import annotations

import torch

from blt import ByteModelConfig, EntropyModel, EntropyPatcher, group_patches
from blt_attn.backend import GlobalAttentionBackend
from blt_attn.metadata import PatchPageTable

from .graphs import PatchGraphRunner
from .model import ByteLatentModel


class ByteEngine:
    def __init__(self, cfg: ByteModelConfig, device_index: int = 0) -> None:
        self.cfg = cfg
        self.device = torch.device(f"cuda:{device_index}")
        entropy = EntropyModel(cfg.num_byte_tokens).to(self.device)
        self.patcher = EntropyPatcher(entropy, cfg.entropy_threshold, cfg.max_patch_len)
        self.page_table = PatchPageTable(cfg, self.device)
        self.backend = GlobalAttentionBackend(cfg, self.page_table, self.device)
        self.model = ByteLatentModel(cfg, self.backend).to(self.device)
        self.kv_cache = torch.zeros(cfg.num_global_layers, cfg.max_pages, 2, cfg.page_size, cfg.num_kv_heads,
                                    cfg.head_dim, dtype=torch.bfloat16, device=self.device)
        self.runner = PatchGraphRunner(self.model, self.backend, cfg, self.device)
        self.backend.init_cuda_graph_state()
        self.backend.check_layouts()

    def capture_all(self) -> None:
        for bs in reversed(self.cfg.patch_buckets):
            self.backend.init_forward_metadata_capture_cuda_graph(bs)
            self.runner.capture_one_batch_size(bs, self.kv_cache)

    def prefill(self, byte_ids: torch.Tensor, kv_indptr_cpu: torch.Tensor, kv_indices: torch.Tensor,
                last_len_cpu: torch.Tensor) -> torch.Tensor:
        batch = group_patches(byte_ids, self.patcher, self.device)
        self.backend.plan_prefill(batch, kv_indptr_cpu, kv_indices, last_len_cpu)
        patch_h, _ = self.model.encoder(byte_ids, batch.patch_lens.new_zeros(byte_ids.numel()))
        return patch_h

    def step(self, byte_ids: torch.Tensor, slots_cpu: torch.Tensor, kv_lens_cpu: torch.Tensor) -> torch.Tensor:
        batch = group_patches(byte_ids, self.patcher, self.device)
        meta = self.backend.init_forward_metadata(batch, slots_cpu, kv_lens_cpu)
        bs = meta.batch_size
        if bs in self.runner.graphs:
            self.runner.static_byte_ids[:bs, : byte_ids.shape[1]].copy_(byte_ids)  # ok: FC104
            logits = self.runner.replay(bs, meta)
        else:
            logits = self.model(byte_ids, meta.patch_index, self.kv_cache)
        return logits[:, -1].argmax(-1)
