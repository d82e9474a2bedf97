"""Decode attention for the EAGLE draft head's steps (trtllm-gen kernels on Blackwell)."""

from __future__ import annotations

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from spec_tree.config import SpecConfig


class DraftDecodeBackend:
    def __init__(self, cfg: SpecConfig, device: torch.device):
        self.cfg = cfg
        max_seqs = cfg.max_batch_size * cfg.topk
        ws_bytes = max_seqs * cfg.num_draft_steps * cfg.num_qo_heads * cfg.head_dim * 4 + (16 << 20)
        self.draft_workspace = torch.empty(ws_bytes, dtype=torch.uint8, device=device)  # expect: FC105  # ok: FC106
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.draft_workspace, "HND", backend="trtllm-gen")
        self.kv_indptr_cpu = torch.zeros(max_seqs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones(max_seqs, dtype=torch.int32, pin_memory=True)
        self.kv_indices = torch.zeros(max_seqs * cfg.max_pages_per_req, dtype=torch.int32, device=device)

    def plan_step(self, num_seqs: int, pages_per_seq: np.ndarray, last_page_len: np.ndarray) -> None:
        np.cumsum(pages_per_seq[:num_seqs], out=self.kv_indptr_cpu.numpy()[1 : num_seqs + 1])
        self.kv_last_page_len_cpu.numpy()[:num_seqs] = last_page_len[:num_seqs]
        self.decode_wrapper.plan(  # ok: FC102
            self.kv_indptr_cpu[: num_seqs + 1],
            self.kv_indices,
            self.kv_last_page_len_cpu[:num_seqs],
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            q_data_type=self.cfg.dtype,
        )

    def forward(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.decode_wrapper.run(q, kv_cache)  # expect: FC108
