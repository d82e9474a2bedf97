"""Per-rank decode metadata: graph-mode wrappers per bucket over shared bound buffers, an eager
wrapper past the buckets (trtllm-gen for long rows), and a shared-system-prompt wrapper whose
output is merged by LSE."""
from __future__ import annotations

from typing import Dict

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, merge_state

from vpsample.config import TPServeConfig
from vpsample.envs import global_config
from vpsample.step import RankStep


def advance_lengths(last_page_len: torch.Tensor, page_size: int) -> None:
    """This step's last-page lengths become the next step's, without a host round trip."""
    last_page_len.remainder_(page_size).add_(1)


class RankAttnMetadata:
    BACKENDS = {"graph": "fa2", "long": "trtllm-gen"}
    _INDICES_ATTR = "_paged_kv_indices_buf"

    def __init__(self, cfg: TPServeConfig, rank: int, device: torch.device):
        self.cfg = cfg
        self.rank = rank
        self.device = device
        rows = cfg.max_batch_size
        self.kv_indptr_buf = torch.zeros(rows + 1, dtype=torch.int32, device=device)
        self.kv_indices_buf = torch.zeros(cfg.max_pages, dtype=torch.int32, device=device)
        self.last_page_len_buf = torch.ones(rows, dtype=torch.int32, device=device)
        self.kv_indptr_cpu = torch.zeros(rows + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_cpu = torch.ones(rows, dtype=torch.int32, pin_memory=True)
        self.seq_lens_cpu = torch.zeros(rows, dtype=torch.int32, pin_memory=True)
        # device copies for the eager wrapper and for the sampler's per-row extents
        self.kv_indptr = torch.zeros(rows + 1, dtype=torch.int32, device=device)
        self.eager_last_page_len = torch.ones(rows, dtype=torch.int32, device=device)
        self.page_counts = torch.zeros(rows, dtype=torch.int32, device=device)
        self.prefix_pages_np = np.arange(cfg.shared_prefix_pages, dtype=np.int32)
        self.prefix_last_fill = cfg.page_size
        self.any_long = False

        self.graph_ws = torch.empty(global_config.attn_workspace_bytes, dtype=torch.uint8, device=device)  # expect: FC106
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        for bs in cfg.graph_buckets:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_ws,
                "HND",
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.kv_indptr_buf[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices_buf,
                paged_kv_last_page_len_buffer=self.last_page_len_buf[:bs],
                backend=self.BACKENDS["graph"],
            )
        self.eager_ws = torch.empty(cfg.eager_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.eager = BatchDecodeWithPagedKVCacheWrapper(self.eager_ws, "HND", backend=self.BACKENDS["graph"])
        self.long_ws = torch.empty(cfg.long_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105
        self.long_decode = BatchDecodeWithPagedKVCacheWrapper(self.long_ws, "HND", backend=self.BACKENDS["long"])
        self.prefix_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.eager_ws, "HND", backend=self.BACKENDS["graph"])

    def _dims(self):
        c = self.cfg
        return c.local_qo_heads, c.local_kv_heads, c.head_dim, c.page_size

    def shared_indices_view(self, bs: int) -> torch.Tensor:
        return getattr(self.graph_wrappers[bs], self._INDICES_ATTR)  # expect: FC103

    # -- set-up ------------------------------------------------------------------------------

    def init_graph_buffers(self) -> None:
        self.kv_indptr_buf.zero_()
        self.kv_indices_buf.zero_()
        self.last_page_len_buf.fill_(1)  # ok: FC104

    def _plan_prefix(self, bs: int) -> None:
        H, KV, D, P = self._dims()
        n = self.prefix_pages_np.size
        indptr_np = np.arange(bs + 1, dtype=np.int32) * n
        indices_np = np.tile(self.prefix_pages_np, bs)
        last_np = np.full(bs, self.prefix_last_fill, dtype=np.int32)
        self.prefix_wrapper.plan(  # ok: FC102
            torch.from_numpy(indptr_np), torch.from_numpy(indices_np).to(self.device, non_blocking=True),
            torch.from_numpy(last_np), H, KV, D, P, data_type=self.cfg.dtype,
        )

    def warm_bucket(self, bs: int) -> None:
        H, KV, D, P = self._dims()
        self.kv_indptr_cpu[: bs + 1].copy_(torch.arange(bs + 1, dtype=torch.int32))
        self.last_page_len_cpu[:bs].fill_(1)
        self.graph_wrappers[bs].plan(
            self.kv_indptr_cpu[: bs + 1], self.kv_indices_buf[:bs], self.last_page_len_cpu[:bs],
            H, KV, D, P, data_type=self.cfg.dtype,
        )
        self._plan_prefix(bs)

    # -- per step ----------------------------------------------------------------------------

    def refresh(self, step: RankStep, padded: int) -> None:
        H, KV, D, P = self._dims()
        bs = step.num_rows
        w = self.graph_wrappers[padded]
        if w._fixed_batch_size != padded:  # expect: FC103
            raise RuntimeError(f"bucket {padded} wrapper was built for another batch size")
        self.seq_lens_cpu[:bs].copy_(step.seq_lens_cpu)
        longest = int(self.seq_lens_cpu[:bs].max())  # ok: FC101
        if longest > self.cfg.max_context_len:
            raise ValueError(f"row of {longest} tokens exceeds max_context_len={self.cfg.max_context_len}")
        nnz = step.indptr_list[-1]
        self.kv_indptr_cpu[: bs + 1].copy_(step.kv_indptr_cpu)
        self.kv_indptr_cpu[bs + 1 : padded + 1].fill_(nnz)
        self.last_page_len_cpu[:bs].copy_(step.last_page_len_cpu)
        self.last_page_len_cpu[bs:padded].fill_(1)
        self.page_counts[:bs].copy_(step.page_counts_cpu, non_blocking=True)
        self.page_counts[bs:padded].zero_()
        self.kv_indices_buf[:nnz].copy_(step.kv_indices, non_blocking=True)  # ok: FC104
        w.plan(  # ok: FC102
            self.kv_indptr_cpu[: padded + 1], self.kv_indices_buf[:nnz], self.last_page_len_cpu[:padded],
            H, KV, D, P, data_type=self.cfg.dtype,
        )
        self._plan_prefix(padded)
        # the sampler's repetition window reads per-row extents from the device indptr
        torch.cumsum(self.page_counts[:padded], 0, out=self.kv_indptr_buf[1 : padded + 1])  # expect: FC104

    def refresh_eager(self, step: RankStep) -> None:
        H, KV, D, P = self._dims()
        bs = step.num_rows
        self.kv_indptr[: bs + 1].copy_(step.kv_indptr_cpu, non_blocking=True)
        self.eager_last_page_len[:bs].copy_(step.last_page_len_cpu, non_blocking=True)
        self.eager.plan(  # expect: FC102
            self.kv_indptr[: bs + 1], step.kv_indices, self.eager_last_page_len[:bs], H, KV, D, P, data_type=self.cfg.dtype
        )
        self.any_long = step.any_long
        if step.any_long:
            self.long_decode.plan(
                step.kv_indptr_cpu, step.kv_indices, step.last_page_len_cpu, H, KV, D, P, data_type=self.cfg.dtype
            )
        self._plan_prefix(bs)

    # -- forward -----------------------------------------------------------------------------

    def forward_decode(self, q: torch.Tensor, kv_cache, bs: int) -> torch.Tensor:
        if bs in self.graph_wrappers:
            w = self.graph_wrappers[bs]
        else:
            w = self.long_decode if self.any_long else self.eager
        o, lse = w.run(q, kv_cache, return_lse=True)  # ok: FC108
        o_prefix, lse_prefix = self.prefix_wrapper.run(q, kv_cache, return_lse=True)  # expect: FC108
        out, _ = merge_state(o, lse, o_prefix, lse_prefix)
        return out
