"""Decode attention: graph-mode wrappers per bucket plus a shared system-prompt prefix merged by LSE."""
from __future__ import annotations

from typing import Dict, Sequence

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper, merge_state

from colo import DECODE_WS_BYTES, EngineConfig


class DecodeAttention:
    def __init__(self, cfg: EngineConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self._use_cuda_graph = cfg.use_cuda_graph
        self.graph_workspace = torch.empty(DECODE_WS_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.prefix_workspace = torch.empty(cfg.prefix_ws_bytes, dtype=torch.uint8, device=device)  # ok: FC105

        max_bs = max(cfg.decode_buckets)
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(max_bs * cfg.max_pages_per_seq, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.k_scale = torch.ones(1, dtype=torch.float32, device=device)

        # The shared system prompt: every decode row attends the same prefix pages.
        self.prefix_pages = torch.zeros(0, dtype=torch.int32, device=device)
        self.prefix_kv_indptr_cpu = torch.zeros(2, dtype=torch.int32)
        self.prefix_last_cpu = torch.ones(1, dtype=torch.int32)
        self.prefix_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefix_workspace, "NHD")
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}

    def set_shared_prefix(self, pages: torch.Tensor, prefix_len: int) -> None:
        self.prefix_pages = pages
        self.prefix_kv_indptr_cpu[1] = pages.numel()
        self.prefix_last_cpu[0] = (prefix_len - 1) % self.cfg.page_size + 1

    def init_graph_wrappers(self, buckets: Sequence[int]) -> None:
        self.kv_last_page_len.fill_(1)  # ok: FC104
        for bs in buckets:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace,
                "NHD",
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
            )

    def _dims(self) -> tuple:
        c = self.cfg
        return c.num_qo_heads, c.num_kv_heads, c.head_dim, c.page_size

    def _fill_host_indptr(self, bs: int, raw_bs: int, seq_lens_cpu: torch.Tensor) -> int:
        ps = self.cfg.page_size
        pages = (seq_lens_cpu[:raw_bs] + ps - 1) // ps
        self.kv_indptr_cpu[1 : raw_bs + 1] = torch.cumsum(pages, 0)
        self.kv_indptr_cpu[raw_bs + 1 : bs + 1] = self.kv_indptr_cpu[raw_bs]
        self.kv_last_page_len_cpu[:raw_bs] = (seq_lens_cpu[:raw_bs] - 1) % ps + 1
        self.kv_last_page_len_cpu[raw_bs:bs] = 1
        return int(self.kv_indptr_cpu[bs])

    def _plan_prefix(self, bs: int) -> None:
        qo_indptr_cpu = torch.tensor([0, bs], dtype=torch.int32)
        self.prefix_wrapper.plan(
            qo_indptr_cpu,
            self.prefix_kv_indptr_cpu,
            self.prefix_pages,
            self.prefix_last_cpu,
            *self._dims(),
            causal=False,
        )

    def prepare_capture(self, bs: int) -> None:
        nnz = self._fill_host_indptr(bs, bs, torch.ones(bs, dtype=torch.int32))
        self.graph_wrappers[bs].plan(  # ok: FC102
            self.kv_indptr_cpu[: bs + 1],
            self.kv_indices[:nnz],
            self.kv_last_page_len_cpu[:bs],
            *self._dims(),
        )
        self._plan_prefix(bs)

    def prepare_replay(self, bs: int, raw_bs: int, seq_lens_cpu: torch.Tensor, indices: torch.Tensor) -> None:
        if not self._use_cuda_graph:  # ok: FC103
            raise RuntimeError("decode graphs are disabled in this engine config")
        nnz = self._fill_host_indptr(bs, raw_bs, seq_lens_cpu)
        self.kv_indices[:nnz].copy_(indices[:nnz], non_blocking=True)  # ok: FC104
        self.graph_wrappers[bs].plan(  # ok: FC102
            self.kv_indptr_cpu[: bs + 1],
            self.kv_indices[:nnz],
            self.kv_last_page_len_cpu[:bs],
            *self._dims(),
        )
        self._plan_prefix(bs)

    def forward(self, q: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> torch.Tensor:
        k_scale = self.k_scale.item()  # expect: FC101
        o_suffix, lse_suffix = self.graph_wrappers[bs].run(q, kv_cache, k_scale=k_scale, return_lse=True)  # ok: FC108
        o_prefix, lse_prefix = self.prefix_wrapper.run(q, kv_cache, return_lse=True)  # expect: FC108
        o, _ = merge_state(o_prefix, lse_prefix, o_suffix, lse_suffix)
        return o
