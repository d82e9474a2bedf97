"""FlashInfer attention of the MoE engine: trtllm-gen graph wrappers per bucket, MTP and overflow paths."""
from __future__ import annotations

import functools
import os
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from moemon import PAGE_SIZE, MoEConfig
from mm_attn.workspace import build_mtp_wrapper, graph_ws_bytes, mtp_ws_bytes, overflow_workspace, zeroed_workspace


def _layout_of(wrapper) -> str:
    return wrapper._kv_layout  # expect: FC103


class AttnBackend:
    def __init__(self, cfg: MoEConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self._kv_layout = "HND"
        self.graph_workspace = zeroed_workspace(graph_ws_bytes(cfg), device)
        self.prefill_workspace = torch.empty(int(os.environ.get("MOEMON_PREFILL_WS_BYTES", 256 << 20)), dtype=torch.uint8, device=device)  # expect: FC106
        self.mtp_workspace = torch.empty(mtp_ws_bytes(cfg), dtype=torch.uint8, device=device)  # ok: FC106
        self.overflow_ws = overflow_workspace(graph_ws_bytes(cfg), device.index or 0)

        max_bs = max(cfg.decode_buckets)
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(max_bs * cfg.max_pages_per_seq, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_pinned = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)

        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, self._kv_layout)
        self.mtp_wrapper = build_mtp_wrapper(self.mtp_workspace, self._kv_layout)
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.layout_probes: List[Callable[[], str]] = []
        self.overflow_block_tables: Optional[torch.Tensor] = None
        self.overflow_seq_lens: Optional[torch.Tensor] = None
        self.overflow_max_len = 0
        self.bmm1_scale = cfg.head_dim**-0.5

    def _heads(self) -> dict:
        c = self.cfg
        return dict(num_qo_heads=c.num_qo_heads, num_kv_heads=c.num_kv_heads, head_dim=c.head_dim, page_size=PAGE_SIZE)

    def init_graph_buffers(self, buckets: Sequence[int]) -> None:
        self.kv_last_page_len.fill_(1)  # ok: FC104
        for bs in buckets:
            w = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace,
                self._kv_layout,
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
                backend="trtllm-gen",
            )
            self.graph_wrappers[bs] = w
            self.layout_probes.append(functools.partial(_layout_of, w))

    def describe(self) -> dict:
        return {"layout": self._kv_layout, "graph_layouts": [probe() for probe in self.layout_probes]}  # ok: FC103

    def _host_tables(self, bs: int, raw_bs: int, seq_lens_np: np.ndarray) -> int:
        pages = (seq_lens_np[:raw_bs] + PAGE_SIZE - 1) // PAGE_SIZE
        indptr_np = np.zeros(bs + 1, dtype=np.int32)
        np.cumsum(pages, out=indptr_np[1 : raw_bs + 1])
        indptr_np[raw_bs + 1 :] = indptr_np[raw_bs]
        self.kv_indptr_pinned[: bs + 1].copy_(torch.from_numpy(indptr_np))
        last_np = np.ones(bs, dtype=np.int32)
        last_np[:raw_bs] = (seq_lens_np[:raw_bs] - 1) % PAGE_SIZE + 1
        self.kv_last_page_len_cpu[:bs].copy_(torch.from_numpy(last_np))
        return int(indptr_np[bs])

    def prepare_decode(self, bs: int, raw_bs: int, seq_lens_np: np.ndarray, page_ids: torch.Tensor) -> None:
        nnz = self._host_tables(bs, raw_bs, seq_lens_np)
        self.kv_indices[:nnz].copy_(page_ids[:nnz], non_blocking=True)  # ok: FC104
        self.kv_last_page_len[:bs].copy_(self.kv_last_page_len_cpu[:bs], non_blocking=True)
        plan_kwargs = dict(
            indptr=self.kv_indptr_pinned[: bs + 1],
            indices=self.kv_indices[:nnz],
            last_page_len=self.kv_last_page_len[:bs],
            q_data_type=torch.bfloat16,
            **self._heads(),
        )
        self.graph_wrappers[bs].plan(**plan_kwargs)  # expect: FC102
        self.plan_mtp(bs, self.kv_indices[:nnz])

    def plan_mtp(self, bs: int, indices: torch.Tensor) -> None:
        self.mtp_wrapper.plan(
            self.kv_indptr_pinned[: bs + 1],
            indices,
            self.kv_last_page_len_cpu[:bs],
            q_data_type=torch.bfloat16,
            **self._heads(),
        )

    def prepare_overflow(
        self, seq_lens_np: np.ndarray, block_tables: torch.Tensor, seq_lens: torch.Tensor, page_ids: torch.Tensor
    ) -> None:
        """Batches past the largest bucket run eagerly on the trtllm decode kernel."""
        bs = len(seq_lens_np)
        self.overflow_block_tables = block_tables
        self.overflow_seq_lens = seq_lens
        self.overflow_max_len = int(seq_lens_np.max())
        nnz = self._host_tables(bs, bs, seq_lens_np)
        self.plan_mtp(bs, page_ids[:nnz])

    def plan_prefill(self, qo_indptr_cpu: torch.Tensor, kv_indptr_cpu: torch.Tensor, kv_indices: torch.Tensor, last_cpu: torch.Tensor) -> None:
        self.prefill_wrapper.plan(  # ok: FC102
            qo_indptr_cpu, kv_indptr_cpu, kv_indices, last_cpu, causal=True, q_data_type=torch.bfloat16, **self._heads()
        )

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, bs: Optional[int]) -> torch.Tensor:
        if bs is None:
            return trtllm_batch_decode_with_kv_cache(
                q,
                kv_cache,
                self.overflow_ws,
                self.overflow_block_tables,
                self.overflow_seq_lens,
                self.overflow_max_len,
                bmm1_scale=self.bmm1_scale,
                bmm2_scale=1.0,
            )
        return self.graph_wrappers[bs].run(q, kv_cache)  # ok: FC108

    def forward_mtp(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.mtp_wrapper.run(q, kv_cache)  # expect: FC108

    def forward_prefill(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.prefill_wrapper.run(q, kv_cache)
