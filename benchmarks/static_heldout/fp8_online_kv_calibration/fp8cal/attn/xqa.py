"""XQA decode over FP8 pages for eager batches past the largest bucket, once scales are frozen."""
from __future__ import annotations

import torch
from flashinfer import xqa_batch_decode_with_kv_cache

from fp8cal.kv.cache import Fp8PagedKVCache
from fp8cal.settings import CalibSettings


class XqaLongDecode:
    def __init__(self, s: CalibSettings, cache: Fp8PagedKVCache, device: torch.device):
        self.s = s
        self.cache = cache
        self.workspace = torch.empty(s.xqa_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.workspace.zero_()
        self.sm_scale = s.head_dim ** -0.5

    def run(self, layer_id: int, q: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor, max_seq_len: int):
        k, v = self.cache.fp8_kv(layer_id)
        return xqa_batch_decode_with_kv_cache(
            q,
            (k, v),
            self.workspace,
            block_tables,
            seq_lens,
            max_seq_len,
            bmm1_scale=self.cache.k_scale[layer_id] * self.sm_scale,
            bmm2_scale=self.cache.v_scale[layer_id],
        )
