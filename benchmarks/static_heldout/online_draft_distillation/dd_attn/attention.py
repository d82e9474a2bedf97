"""Draft and target attention: decode graphs per bucket for the draft (k replays per step), verify
graphs per bucket for the target, a ragged wrapper for the draft's training windows, and eager
wrappers for prompts and for batches past the largest bucket."""
from typing import Dict

import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    trtllm_batch_decode_with_kv_cache,
)

from distill import DistillConfig

from .layout import SpecBatch, _pad_rows, spec_qo_indptr
from .workspace import draft_graph_workspace, draft_train_workspace, verify_workspace


class DraftAttention:
    def __init__(self, cfg: DistillConfig, device: torch.device):
        self.cfg, self.device = cfg, device
        max_bs = cfg.max_bucket
        self.kv_indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices_buf = torch.zeros(max_bs * cfg.pages_per_seq, dtype=torch.int32, device=device)
        self.last_page_len_buf = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        ws = draft_graph_workspace(device)
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {
            bs: BatchDecodeWithPagedKVCacheWrapper(
                ws, "NHD", use_cuda_graph=True,
                paged_kv_indptr_buffer=self.kv_indptr_buf[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices_buf,
                paged_kv_last_page_len_buffer=self.last_page_len_buf[:bs],
            )
            for bs in cfg.draft_buckets
        }
        self.train_wrapper = BatchPrefillWithRaggedKVCacheWrapper(draft_train_workspace(cfg), "NHD")
        self.train_mode = False
        self._heads = dict(
            num_qo_heads=cfg.num_qo_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
            page_size=cfg.page_size, q_data_type=torch.bfloat16,
        )

    def init_buffers(self) -> None:
        self.last_page_len_buf.fill_(1)  # ok: FC104

    def plan_bucket(self, bs: int, batch: SpecBatch, j: int) -> None:
        """Plan the ``j``-th draft replay: every row has ``j`` more tokens than its committed length."""
        n = batch.num_rows
        indptr, lp = self.kv_indptr_host.numpy(), self.last_page_len_host.numpy()
        indptr[: n + 1] = batch.kv_indptr_cpu.numpy()
        indptr[n + 1 : bs + 1] = indptr[n]
        lp[:n] = (batch.seq_lens_np + j - 1) % self.cfg.page_size + 1
        lp[n:bs] = 1
        if j == 0:
            self.kv_indices_buf[: batch.num_pages].copy_(batch.kv_indices, non_blocking=True)  # ok: FC104
        self.graph_wrappers[bs].plan(  # ok: FC102
            self.kv_indptr_host[: bs + 1], self.kv_indices_buf, self.last_page_len_host[:bs], **self._heads
        )

    def plan_train(self, window: int, total: int) -> None:
        indptr = torch.arange(0, total + 1, window, dtype=torch.int32)
        self.train_wrapper.plan(
            indptr, indptr, self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim,
            causal=True, q_data_type=torch.bfloat16,
        )

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> torch.Tensor:
        if self.train_mode:
            return self.train_wrapper.run(q, k, v)  # expect: FC108
        return self.graph_wrappers[bs].run(q, kv_cache)  # ok: FC108


class TargetAttention:
    def __init__(self, cfg: DistillConfig, device: torch.device):
        self.cfg, self.device, self.k = cfg, device, cfg.num_draft_tokens
        max_bs = cfg.max_bucket
        self.qo_indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices_buf = torch.zeros(max_bs * cfg.pages_per_seq, dtype=torch.int32, device=device)
        self.last_page_len_buf = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        ws = verify_workspace(cfg)
        self.verify_wrappers: Dict[int, BatchPrefillWithPagedKVCacheWrapper] = {
            bs: BatchPrefillWithPagedKVCacheWrapper(
                ws, "NHD", use_cuda_graph=True,
                qo_indptr_buf=self.qo_indptr_buf[: bs + 1],
                paged_kv_indptr_buf=self.kv_indptr_buf[: bs + 1],
                paged_kv_indices_buf=self.kv_indices_buf,
                paged_kv_last_page_len_buf=self.last_page_len_buf[:bs],
            )
            for bs in cfg.draft_buckets
        }
        sizes = {"prompt": cfg.prompt_workspace_bytes(), "eager_decode": cfg.eager_decode_workspace_bytes()}
        self.workspaces = {name: torch.empty(nbytes, dtype=torch.uint8, device=device) for name, nbytes in sizes.items()}  # expect: FC105
        self.prompt_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.workspaces["prompt"], "NHD")

    def _fill_host(self, bs: int, batch: SpecBatch, extra: int) -> None:
        n = batch.num_rows
        indptr, lp = self.kv_indptr_host.numpy(), self.last_page_len_host.numpy()
        indptr[: n + 1] = batch.kv_indptr_cpu.numpy()
        indptr[n + 1 : bs + 1] = indptr[n]
        lp[:n] = (batch.seq_lens_np + extra - 1) % self.cfg.page_size + 1
        lp[n:bs] = 1

    def plan_verify(self, bs: int, batch: SpecBatch) -> None:
        self._fill_host(bs, batch, self.k + 1)
        self.kv_indices_buf[: batch.num_pages].copy_(batch.kv_indices, non_blocking=True)
        c = self.cfg
        self.verify_wrappers[bs].plan(  # expect: FC102
            spec_qo_indptr(bs, self.k, self.device), self.kv_indptr_host[: bs + 1], self.kv_indices_buf,
            self.last_page_len_host[:bs], c.num_qo_heads, c.num_kv_heads, c.head_dim, c.page_size, causal=True,
        )
        _pad_rows(self.last_page_len_buf, batch.num_rows, bs)  # expect: FC104

    def plan_prompt(self, qo_indptr_cpu: torch.Tensor, batch: SpecBatch) -> None:
        self._fill_host(batch.num_rows, batch, 0)
        n, c = batch.num_rows, self.cfg
        self.prompt_wrapper.plan(  # ok: FC102
            qo_indptr_cpu, self.kv_indptr_host[: n + 1], batch.kv_indices, self.last_page_len_host[:n],
            c.num_qo_heads, c.num_kv_heads, c.head_dim, c.page_size, causal=True,
        )

    def attend_verify(self, q: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> torch.Tensor:
        return self.verify_wrappers[bs].run(q, kv_cache)

    def attend_prompt(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.prompt_wrapper.run(q, kv_cache)

    def attend_eager_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                            seq_lens: torch.Tensor, max_seq_len: int) -> torch.Tensor:
        return trtllm_batch_decode_with_kv_cache(
            q, kv_cache, self.workspaces["eager_decode"], block_tables, seq_lens, max_seq_len,
            bmm1_scale=self.cfg.head_dim ** -0.5, bmm2_scale=1.0,
        )
