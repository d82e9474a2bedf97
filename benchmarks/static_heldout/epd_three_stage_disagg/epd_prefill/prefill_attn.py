"""Attention of the prefill stage: ragged for fresh prompts, paged when a cached prefix exists."""

from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import torch
from flashinfer import BatchPrefillWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper

from epd.config import EPDConfig
from epd.workspace import prefill_paged_workspace


@dataclass
class PrefillBatch:
    input_ids: torch.Tensor
    input_ids_np: np.ndarray
    qo_indptr: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor
    cu_seqlens_list: List[int]
    has_prefix: bool
    mm_dst: Optional[torch.Tensor] = None
    video_dst: Optional[torch.Tensor] = None


class PrefillAttnBackend:
    def __init__(self, cfg: EPDConfig) -> None:
        self.cfg = cfg
        self.device = cfg.device
        self.ragged_ws = torch.empty(cfg.prefill_workspace_bytes(), dtype=torch.uint8, device=cfg.device)  # ok: FC105
        self.ragged = BatchPrefillWithRaggedKVCacheWrapper(self.ragged_ws, "NHD", backend="fa2")
        self.paged_prefill = BatchPrefillWithPagedKVCacheWrapper(
            prefill_paged_workspace(cfg.device), "NHD", backend="fa2"
        )

    def init_forward_metadata(self, fb: PrefillBatch) -> None:
        cfg = self.cfg
        # where the encoder's rows go in the flattened prompt
        fb.mm_dst = torch.from_numpy(np.flatnonzero(fb.input_ids_np == cfg.image_token_id)).to(self.device, non_blocking=True)  # ok: FC101
        fb.video_dst = torch.nonzero(fb.input_ids == cfg.video_token_id).squeeze(1)  # expect: FC101
        if fb.has_prefix:
            args = (fb.qo_indptr, fb.kv_indptr_cpu, fb.kv_indices, fb.kv_last_page_len_cpu)
            self.paged_prefill.plan(  # expect: FC102
                *args, cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size, causal=True
            )
        else:
            cu = torch.tensor(fb.cu_seqlens_list, dtype=torch.int32)
            self.ragged.plan(cu, cu, cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, causal=True)  # ok: FC102

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, fb: PrefillBatch):
        if fb.has_prefix:
            return self.paged_prefill.run(q, kv_cache)
        return self.ragged.run(q, k, v)
