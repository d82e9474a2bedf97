"""A shared system prompt attended once per step and merged into the plugin's output."""
from __future__ import annotations

import torch
import flashinfer
from flashinfer import BatchPrefillWithPagedKVCacheWrapper

from plugattn.forward_batch import ForwardBatch, PluginConfig


class SharedPrefixMerger:
    def __init__(self, cfg: PluginConfig, workspace: torch.Tensor):
        self.cfg = cfg
        self.wrapper = BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
        self.qo_indptr_host = torch.arange(cfg.max_bs + 1, dtype=torch.int32)
        self.kv_indptr_host = torch.zeros(cfg.max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_host = torch.ones(cfg.max_bs, dtype=torch.int32, pin_memory=True)
        self.enabled = False

    def plan(self, fb: ForwardBatch) -> None:
        if fb.shared_prefix_pages is None:
            self.enabled = False
            return
        bs = fb.bs
        n = fb.shared_prefix_pages.numel()
        self.kv_indptr_host[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32) * n
        c = self.cfg
        self.wrapper.plan(
            self.qo_indptr_host[: bs + 1], self.kv_indptr_host[: bs + 1], fb.shared_prefix_pages.repeat(bs),
            self.last_page_host[:bs], c.num_qo_heads, c.num_kv_heads, c.head_dim, c.page_size, causal=False,
        )
        self.enabled = True

    def merge(self, q: torch.Tensor, kv_cache: torch.Tensor, o: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
        o_p, lse_p = self.wrapper.run_return_lse(q, kv_cache)  # expect: FC108
        out, _ = flashinfer.merge_state(o, lse, o_p, lse_p)
        return out
