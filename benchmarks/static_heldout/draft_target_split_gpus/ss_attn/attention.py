"""Per-device attention state: buffers, workspaces and wrappers for one GPU."""
from __future__ import annotations

from typing import Dict, Tuple

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper, merge_state

from splitspec import SplitConfig


class DeviceAttention:
    """Buffers shared by every graph-mode wrapper on one device."""

    def __init__(self, cfg: SplitConfig, device: torch.device, workspace: torch.Tensor) -> None:
        self.cfg = cfg
        self.device = device
        self.workspace = workspace
        mb = cfg.max_batch
        self.kv_indptr = torch.zeros(mb + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(cfg.max_pages_per_step, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(mb, dtype=torch.int32, device=device)
        self._backend = "fa2"
        self.active_bs = 0

    def init_buffers(self) -> None:
        self.kv_indptr.zero_()
        self.kv_last_page_len.fill_(1)  # ok: FC104

    @property
    def dims(self) -> Tuple[int, int, int, int]:
        c = self.cfg
        return c.num_qo_heads, c.num_kv_heads, c.head_dim, c.page_size

    def describe(self) -> Dict[str, str]:
        return {"device": str(self.device), "backend": self._backend}  # ok: FC103


class DraftAttention(DeviceAttention):
    def __init__(self, cfg: SplitConfig, device: torch.device, workspace: torch.Tensor) -> None:
        super().__init__(cfg, device, workspace)
        self.decode_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {
            bs: BatchDecodeWithPagedKVCacheWrapper(
                workspace,
                "NHD",
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
            )
            for bs in cfg.buckets
        }
        # attention over the tokens the target accepted last round
        self.catchup = BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")

    def backends(self) -> Dict[int, str]:
        return {bs: w._backend for bs, w in self.decode_wrappers.items()}  # expect: FC103

    def forward(self, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        o_dec, lse_dec = self.decode_wrappers[self.active_bs].run(q, kv, return_lse=True)  # ok: FC108
        o_new, lse_new = self.catchup.run(q, kv, return_lse=True)  # expect: FC108
        out, _ = merge_state(o_dec, lse_dec, o_new, lse_new)
        return out


class TargetAttention(DeviceAttention):
    def __init__(self, cfg: SplitConfig, device: torch.device, workspace: torch.Tensor) -> None:
        super().__init__(cfg, device, workspace)
        k1 = cfg.num_draft_tokens + 1
        self.qo_indptr = torch.arange(0, (cfg.max_batch + 1) * k1, k1, dtype=torch.int32, device=device)
        self.verify_wrappers: Dict[int, BatchPrefillWithPagedKVCacheWrapper] = {}
        for bs in cfg.buckets:
            self.verify_wrappers[bs] = BatchPrefillWithPagedKVCacheWrapper(
                workspace,
                "NHD",
                use_cuda_graph=True,
                qo_indptr_buf=self.qo_indptr[: bs + 1],
                paged_kv_indptr_buf=self.kv_indptr[: bs + 1],
                paged_kv_indices_buf=self.kv_indices,
                paged_kv_last_page_len_buf=self.kv_last_page_len[:bs],
            )
        ws = torch.empty(cfg.verify_eager_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        ws.zero_()
        self.verify_eager = BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend="trtllm-gen")
        self._fixed_batch_size = max(cfg.buckets)
        self.graph_mode = True

    def largest_bucket(self) -> int:
        return self._fixed_batch_size  # ok: FC103

    def forward(self, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        w = self.verify_wrappers[self.active_bs] if self.graph_mode else self.verify_eager
        return w.run(q, kv)
