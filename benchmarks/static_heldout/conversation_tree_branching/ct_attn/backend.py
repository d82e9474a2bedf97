"""Attention over a conversation tree: decode graphs per bucket over full page tables, a
two-level cascade (shared trunk, per-branch suffix) for sibling branches, a trtllm-gen paged
prefill for edits and a trtllm decode for batches past the largest bucket."""
from typing import Dict

import numpy as np
import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    MultiLevelCascadeAttentionWrapper,
    trtllm_batch_decode_with_kv_cache,
)

from convtree import ChatServerConfig

from .metadata import TreeStepMeta
from .workspace import cascade_workspace, decode_graph_workspace, edit_prefill_workspace, trtllm_decode_workspace


class TreeAttnBackend:
    def __init__(self, cfg: ChatServerConfig, device: torch.device, scratch_page: int):
        self.cfg, self.device, self.scratch_page = cfg, device, scratch_page
        self._kv_layout = "NHD"  # ok: FC103
        max_bs = cfg.max_bucket
        self.kv_indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices_buf = torch.zeros(max_bs * cfg.pages_per_row, dtype=torch.int32, device=device)
        self.last_page_len_buf = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        ws = decode_graph_workspace(cfg)
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        for bs in cfg.graph_buckets:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                ws, self._kv_layout, use_cuda_graph=True,
                paged_kv_indptr_buffer=self.kv_indptr_buf[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices_buf,
                paged_kv_last_page_len_buffer=self.last_page_len_buf[:bs],
            )
        self.cascade = MultiLevelCascadeAttentionWrapper(2, cascade_workspace(device), self._kv_layout)
        self.prefill = BatchPrefillWithPagedKVCacheWrapper(edit_prefill_workspace(cfg), "HND", backend="trtllm-gen")
        self._heads = dict(num_qo_heads=cfg.num_qo_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, page_size=cfg.page_size)
        self.branch_hist_host = torch.zeros(0, dtype=torch.int64)
        self.scale = cfg.head_dim ** -0.5

    def describe(self) -> str:
        return f"cascade levels={self.cascade._num_levels} buckets={sorted(self.graph_wrappers)}"  # expect: FC103

    def init_cuda_graph_state(self) -> None:
        self.kv_indices_buf.fill_(self.scratch_page)  # ok: FC104
        self.last_page_len_buf.fill_(1)

    def init_forward_metadata(self, meta: TreeStepMeta) -> None:
        c = self.cfg
        if meta.use_cascade:
            self.cascade.plan(  # expect: FC102
                [torch.tensor([0, meta.num_tokens], dtype=torch.int32), meta.qo_indptr_cpu],
                [meta.trunk_kv_indptr_cpu, meta.suffix_kv_indptr],
                [meta.trunk_kv_indices, meta.suffix_kv_indices],
                [torch.tensor([c.page_size], dtype=torch.int32), meta.last_page_len_cpu],
                c.num_qo_heads, c.num_kv_heads, c.head_dim, c.page_size, causal=True,
            )
        elif meta.num_tokens > meta.num_rows:
            self.prefill.plan(  # ok: FC102
                meta.qo_indptr_cpu, meta.kv_indptr_cpu, meta.kv_indices, meta.last_page_len_cpu,
                c.num_qo_heads, c.num_kv_heads, c.head_dim, c.page_size, causal=True,
            )
        # recently active leaves, for the tree cache's eviction order
        self.branch_hist_host = torch.cat([self.branch_hist_host[-4095:], meta.leaf_ids_cpu])  # ok: FC107

    def capture_meta(self, bs: int, positions: torch.Tensor) -> TreeStepMeta:
        return TreeStepMeta(
            num_rows=bs, num_tokens=bs, num_pages=bs, max_seq_len=1, use_cascade=False,
            qo_indptr_cpu=torch.arange(bs + 1, dtype=torch.int32), kv_indptr_cpu=torch.arange(bs + 1, dtype=torch.int32),
            last_page_len_cpu=torch.ones(bs, dtype=torch.int32), kv_indices=self.kv_indices_buf[:bs],
            positions=positions, batch_indices=torch.arange(bs, dtype=torch.int32, device=self.device),
            leaf_ids_cpu=torch.zeros(bs, dtype=torch.int64),
        )

    def init_forward_metadata_capture_cuda_graph(self, bs: int, meta: TreeStepMeta) -> None:
        self.kv_indptr_host[: bs + 1].copy_(meta.kv_indptr_cpu)
        self.graph_wrappers[bs].plan(self.kv_indptr_host[: bs + 1], self.kv_indices_buf, self.last_page_len_host[:bs], **self._heads)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, meta: TreeStepMeta) -> None:
        n, num_pages = meta.num_rows, meta.num_pages
        indptr = self.kv_indptr_host.numpy()
        indptr[: n + 1] = meta.kv_indptr_cpu.numpy()
        indptr[n + 1 : bs + 1] = num_pages + np.arange(1, bs - n + 1)
        self.last_page_len_host[:n].copy_(meta.last_page_len_cpu)
        self.last_page_len_host[n:bs].fill_(1)
        self.kv_indices_buf[:num_pages].copy_(meta.kv_indices, non_blocking=True)  # ok: FC104
        self.graph_wrappers[bs].plan(  # ok: FC102
            self.kv_indptr_host[: bs + 1], self.kv_indices_buf, self.last_page_len_host[:bs], **self._heads
        )
        # padded rows read one token of the scratch page
        self.kv_indices_buf[num_pages : num_pages + bs - n].fill_(self.scratch_page)  # expect: FC104

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, bs: int, meta: TreeStepMeta) -> torch.Tensor:
        if meta.use_cascade:
            return self.cascade.run(q, kv_cache)  # ok: FC108
        return self.graph_wrappers[bs].run(q, kv_cache)  # ok: FC108

    def forward_extend(self, q: torch.Tensor, kv_cache: torch.Tensor, meta: TreeStepMeta) -> torch.Tensor:
        if meta.use_cascade:
            return self.cascade.run(q, kv_cache)
        if meta.num_tokens > meta.num_rows:
            return self.prefill.run(q, kv_cache)
        return trtllm_batch_decode_with_kv_cache(
            q, kv_cache, trtllm_decode_workspace(self.cfg), meta.block_tables, meta.seq_lens,
            meta.max_seq_len, bmm1_scale=self.scale, bmm2_scale=1.0,
        )
