"""Decode attention: graph-mode FA2 wrappers per bucket over shared bound buffers, an eager
wrapper past the buckets, trtllm-gen for long-context rows and a paged prompt prefill."""
from __future__ import annotations

from typing import Dict, List

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from lpserve.attn.workspace import decode_workspace, eager_workspace, long_context_workspace, prefill_workspace
from lpserve.batch import StepBatch
from lpserve.config import ServeConfig
from lpserve.kv import PagePool


class DecodeAttention:
    LONG_BACKEND = "trtllm-gen"

    def __init__(self, cfg: ServeConfig, pool: PagePool, device: torch.device):
        self.cfg = cfg
        self.pool = pool
        self.device = device
        rows = cfg.max_batch_size
        self.kv_indptr_buf = torch.zeros(rows + 1, dtype=torch.int32, device=device)
        self.kv_indices_buf = torch.zeros(cfg.max_pages, dtype=torch.int32, device=device)
        self.last_page_len_buf = torch.ones(rows, dtype=torch.int32, device=device)
        self.kv_indptr_cpu = torch.zeros(rows + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_cpu = torch.ones(rows, dtype=torch.int32, pin_memory=True)
        self.long_row_mask = torch.zeros(rows, dtype=torch.bool, device=device)
        self.long_row_mask_cpu = torch.zeros(rows, dtype=torch.bool, pin_memory=True)

        self.graph_ws = decode_workspace(cfg, device)
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        for bs in cfg.graph_buckets:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_ws,
                "HND",
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.kv_indptr_buf[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices_buf,
                paged_kv_last_page_len_buffer=self.last_page_len_buf[:bs],
            )
        self.eager_decode = BatchDecodeWithPagedKVCacheWrapper(eager_workspace(cfg, device), "HND")
        self.long_decode = BatchDecodeWithPagedKVCacheWrapper(
            long_context_workspace(cfg, device), "HND", backend=self.LONG_BACKEND
        )
        self.prefill = BatchPrefillWithPagedKVCacheWrapper(prefill_workspace(device), "HND")
        self._plan_prefill = self.prefill.plan

    def _dims(self):
        c = self.cfg
        return c.num_qo_heads, c.num_kv_heads, c.head_dim, c.page_size

    def scratch_for_plugins(self, nbytes: int) -> torch.Tensor:
        """Plugins borrow the tail of the eager decode workspace instead of allocating their own."""
        ws = self.eager_decode._float_workspace_buffer  # expect: FC103
        if nbytes > ws.numel():
            raise ValueError(f"plugin scratch of {nbytes} bytes exceeds the {ws.numel()}-byte decode workspace")
        return ws[ws.numel() - nbytes :]

    # -- set-up ------------------------------------------------------------------------------

    def init_graph_buffers(self) -> None:
        self.kv_indptr_buf.zero_()
        self.last_page_len_buf.fill_(1)  # ok: FC104
        self.kv_indices_buf.zero_()

    def init_capture_metadata(self, bs: int) -> None:
        H, KV, D, P = self._dims()
        self.kv_indptr_cpu[: bs + 1].copy_(torch.arange(bs + 1, dtype=torch.int32))
        self.last_page_len_cpu[:bs].fill_(1)
        self.graph_wrappers[bs].plan(
            self.kv_indptr_cpu[: bs + 1], self.kv_indices_buf[:bs], self.last_page_len_cpu[:bs],
            H, KV, D, P, data_type=self.cfg.dtype,
        )
        self._plan_long(list(range(bs + 1)), [1] * bs, self.kv_indices_buf[:bs])

    # -- per step ----------------------------------------------------------------------------

    def _set_long_rows(self, batch: StepBatch) -> None:
        n = batch.num_rows
        self.long_row_mask_cpu[:n].fill_(False)
        for row in batch.long_rows:
            self.long_row_mask_cpu[row] = True
        self.long_row_mask[:n].copy_(self.long_row_mask_cpu[:n], non_blocking=True)

    def _plan_long(self, indptr_list: List[int], last_list: List[int], kv_indices: torch.Tensor) -> None:
        H, KV, D, P = self._dims()
        indptr_host = torch.tensor(indptr_list, dtype=torch.int32)
        last_host = torch.tensor(last_list, dtype=torch.int32)
        self.long_decode.plan(indptr_host, kv_indices, last_host, H, KV, D, P, data_type=self.cfg.dtype)  # ok: FC102

    def plan_eager(self, batch: StepBatch) -> None:
        H, KV, D, P = self._dims()
        self._set_long_rows(batch)
        self.eager_decode.plan(  # expect: FC102
            batch.kv_indptr, batch.kv_indices, batch.last_page_len, H, KV, D, P, data_type=self.cfg.dtype
        )
        self._plan_long(batch.indptr_list, batch.last_page_list, batch.kv_indices)

    def replay_prepare(self, batch: StepBatch, padded: int) -> None:
        H, KV, D, P = self._dims()
        bs = batch.num_rows
        self.kv_indptr_cpu[: bs + 1].copy_(batch.kv_indptr_cpu)
        total = int(self.kv_indptr_cpu[bs])  # ok: FC101
        self.kv_indptr_cpu[bs + 1 : padded + 1].fill_(total)
        self.last_page_len_cpu[:bs].copy_(batch.last_page_len_cpu)
        self.last_page_len_cpu[bs:padded].fill_(1)
        self.kv_indices_buf[:total].copy_(batch.kv_indices, non_blocking=True)  # ok: FC104
        self._set_long_rows(batch)
        self.graph_wrappers[padded].plan(  # ok: FC102
            self.kv_indptr_cpu[: padded + 1], self.kv_indices_buf[:total], self.last_page_len_cpu[:padded],
            H, KV, D, P, data_type=self.cfg.dtype,
        )
        self._plan_long(batch.indptr_list, batch.last_page_list, batch.kv_indices)
        # rows rolled back onto an empty last page must not read a zero-length page
        self.last_page_len_buf[:bs].clamp_(min=1)  # expect: FC104
        self.kv_indptr_cpu[padded + 1 :].zero_()  # ok: FC104

    def plan_prompt(self, qo_lens: List[int], kv_indptr_cpu, kv_indices, last_page_len_cpu) -> None:
        H, KV, D, P = self._dims()
        n = len(qo_lens)
        qo_indptr = torch.zeros(n + 1, dtype=torch.int32, device=self.device)
        lens = torch.tensor(qo_lens, dtype=torch.int32, device=self.device)
        torch.cumsum(lens, 0, dtype=torch.int32, out=qo_indptr[1:])
        self._plan_prefill(qo_indptr, kv_indptr_cpu, kv_indices, last_page_len_cpu, H, KV, D, P, causal=True)  # expect: FC102

    # -- forward -----------------------------------------------------------------------------

    def forward_decode(self, layer_id: int, q: torch.Tensor, bs: int) -> torch.Tensor:
        kv = self.pool.kv_cache[layer_id]
        w = self.graph_wrappers[bs] if bs in self.graph_wrappers else self.eager_decode
        out = w.run(q, kv)  # ok: FC108
        long_out = self.long_decode.run(q, kv)  # expect: FC108
        return torch.where(self.long_row_mask[:bs, None, None], long_out, out)

    def forward_prefill(self, layer_id: int, q: torch.Tensor) -> torch.Tensor:
        return self.prefill.run(q, self.pool.kv_cache[layer_id])
