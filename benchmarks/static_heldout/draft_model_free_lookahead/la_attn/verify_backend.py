"""Verification on a paged prefill wrapper: each row's query attends with a custom (branch) mask."""

from __future__ import annotations

from typing import Dict

import torch
from flashcheck import hot_path
from flashinfer import BatchPrefillWithPagedKVCacheWrapper

from lookahead import LookaheadConfig, build_verify_mask
from la_attn.batch import LookaheadBatch
from la_attn.workspace import VerifyWorkspaces


def _mask_capacity(self) -> int:
    """Installed on the wrapper class: how many mask bits the wrapper's own mask buffer holds."""
    buf = self._custom_mask_buf  # expect: FC103
    return 0 if buf is None else buf.numel() * 8


BatchPrefillWithPagedKVCacheWrapper.mask_capacity = _mask_capacity


def verify_qo_indptr(query_lens: torch.Tensor) -> torch.Tensor:
    return torch.cat([query_lens.new_zeros(1), torch.cumsum(query_lens, 0)]).int()


class VerifyBackend:
    def __init__(self, cfg: LookaheadConfig, workspaces: VerifyWorkspaces, device: torch.device):
        self.cfg, self.device = cfg, device
        self._backend = "fa2"  # ok: FC103
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(workspaces.verify, "NHD", backend=self._backend)
        self.max_q = 1
        self.total_q = 0

    def warm_kernels(self) -> bool:
        return vars(self.prefill_wrapper).get("_cached_module") is not None  # expect: FC103

    def describe(self) -> Dict[str, int]:
        return {"mask_capacity": self.prefill_wrapper.mask_capacity(), "compiled": int(self.warm_kernels())}

    @hot_path
    def prepare_verify(self, batch: LookaheadBatch, query_lens: torch.Tensor, query_lens_cpu: torch.Tensor) -> None:
        c = self.cfg
        self.max_q = int(query_lens.max())  # expect: FC101
        self.total_q = int(query_lens_cpu.sum())  # ok: FC101
        mask = torch.from_numpy(build_verify_mask(batch.branches, batch.cached_lens)).to(self.device, non_blocking=True)
        self.prefill_wrapper.plan(  # expect: FC102
            verify_qo_indptr(query_lens), batch.kv_indptr_cpu, batch.kv_indices, batch.last_page_len_cpu,
            c.num_qo_heads, c.num_kv_heads, c.head_dim, c.page_size,
            custom_mask=mask, q_data_type=torch.bfloat16,
        )

    def verify_forward(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.prefill_wrapper.run(q, kv_cache)  # ok: FC108
