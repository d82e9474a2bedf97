"""Prefix-cache manager: matches requests in the radix tree, offloads cold pages to the host and builds
the FlashInfer page tables for each step."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer.prefill import trtllm_batch_context_with_kv_cache

from .offload import HostKVPool
from .pool import KVPoolBuffers
from .radix import RadixTree

logger = logging.getLogger(__name__)


@dataclass
class Req:
    rid: int
    tokens: list[int]
    new_pages: torch.Tensor
    extend_len: int


class PrefixCacheManager:
    def __init__(self, pool: KVPoolBuffers, max_bs: int, max_tokens: int, num_qo_heads: int) -> None:
        self.pool = pool
        self.device = torch.device("cuda")
        self.max_bs = max_bs
        self.num_qo_heads = num_qo_heads
        self.tree = RadixTree(self.device)
        self.host_pool = HostKVPool(pool.kv, pool.num_pages * 2)
        self.free_pages = pool.num_pages

        fa2_bytes = max_tokens * num_qo_heads * pool.head_dim * 16
        self.fa2_workspace = torch.empty(fa2_bytes, dtype=torch.uint8, device=self.device)  # ok: FC105, FC106
        decode_ws = torch.empty(max_bs * num_qo_heads * pool.head_dim * 64, dtype=torch.uint8, device=self.device)  # ok: FC105, FC106
        decode_ws.zero_()
        self.trtllm_decode_ws = decode_ws

        self.kv_indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.kv_indices_buf = torch.zeros(pool.num_pages, dtype=torch.int32, device=self.device)
        self.last_page_len_buf = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.page_count_cpu = torch.zeros(max_bs, dtype=torch.int32)

        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.fa2_workspace, "NHD")
        self.extend_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.fa2_workspace, "NHD", use_cuda_graph=False)
        self.graph_wrappers: dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}

    # ---------------------------------------------------------------- per step
    def prepare_step(self, reqs: list[Req]) -> None:
        p = self.pool
        page_lists, seq_page_counts = [], []
        for req in reqs:
            node, pages = self.tree.match_prefix(req.tokens)
            if node.host_slot is not None:
                self.host_pool.load_back(node.host_slot, node.value)
                node.host_slot = None
            hit = int(pages.numel())  # ok: FC101
            if hit:
                first_new = pages[-1].item() + 1  # expect: FC101
                logger.debug("req %d reuses %d pages, first new page %d", req.rid, hit, first_new)
            pages = torch.cat([pages, req.new_pages])
            self.tree.insert(req.tokens, pages)
            page_lists.append(pages)
            seq_page_counts.append(pages.numel())
        if self.free_pages < p.num_pages // 10:
            for leaf in self.tree.evict(p.num_pages // 5):
                leaf.host_slot = self.host_pool.offload(leaf.value)

        n = len(reqs)
        seq_pages = torch.tensor(seq_page_counts, dtype=torch.int32, device=self.device)
        kv_indptr = torch.zeros(n + 1, dtype=torch.int32, device=self.device)
        torch.cumsum(seq_pages, 0, out=kv_indptr[1:])
        kv_indices = torch.cat(page_lists)
        flat = kv_indices[: seq_pages.sum()]  # expect: FC101
        self.page_count_cpu[:n] = torch.tensor(seq_page_counts, dtype=torch.int32)
        self.kv_indptr_host[0] = 0
        self.kv_indptr_host[1 : n + 1] = torch.cumsum(self.page_count_cpu[:n], 0)
        self.decode_wrapper.plan(  # expect: FC102
            kv_indptr, flat, self.last_page_len_host[:n],
            self.num_qo_heads, p.num_kv_heads, p.head_dim, p.page_size,
        )
        qo_indptr_host = torch.arange(n + 1, dtype=torch.int32)
        self.extend_wrapper.plan(  # ok: FC102
            qo_indptr_host, self.kv_indptr_host[: n + 1], kv_indices, self.last_page_len_host[:n],
            self.num_qo_heads, p.num_kv_heads, p.head_dim, p.page_size,
        )

    def prepare_graph_step(self, bs: int, reqs: list[Req], kv_indices: torch.Tensor) -> None:
        p = self.pool
        nnz = kv_indices.numel()
        if nnz > self.kv_indices_buf.shape[0]:
            self.kv_indices_buf = torch.cat([self.kv_indices_buf, self.kv_indices_buf.new_zeros(nnz)])  # expect: FC107
        if bs > self.page_count_cpu.shape[0]:
            self.page_count_cpu = torch.cat([self.page_count_cpu, torch.zeros(bs, dtype=torch.int32)])  # ok: FC107
        self.kv_indices_buf[:nnz].copy_(kv_indices)  # ok: FC104
        self.graph_wrappers[bs].plan(
            self.kv_indptr_host[: bs + 1], self.kv_indices_buf, self.last_page_len_host[:bs],
            self.num_qo_heads, p.num_kv_heads, p.head_dim, p.page_size,
        )

    # ---------------------------------------------------------------- offload thread
    def remap_after_load(self, lut: torch.Tensor, nnz: int) -> None:
        """Pages loaded back from the host land at new device slots: rewrite the page tables."""
        for bs, w in self.graph_wrappers.items():
            idx = w._paged_kv_indices_buf  # expect: FC103
            idx[:nnz] = lut[idx[:nnz].long()]  # expect: FC104
            logger.debug("remapped page table of graph bs=%d", bs)

    # ---------------------------------------------------------------- graphs
    def capture_graphs(self, batch_sizes: list[int], q: torch.Tensor, out: torch.Tensor) -> None:
        p = self.pool
        for bs in batch_sizes:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.fa2_workspace, "NHD", use_cuda_graph=True,
                paged_kv_indptr_buffer=self.kv_indptr_buf[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices_buf,
                paged_kv_last_page_len_buffer=self.last_page_len_buf[:bs],
            )
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                out[:bs] = self.forward_decode(q[:bs], bs)
                out[:bs] += self.forward_extend(q[:bs])
            self.graphs[bs] = g

    def forward_decode(self, q: torch.Tensor, bs: int) -> torch.Tensor:
        return self.graph_wrappers[bs].run(q, self.pool.kv)  # ok: FC108

    def forward_extend(self, q: torch.Tensor) -> torch.Tensor:
        return self.extend_wrapper.run(q, self.pool.kv)  # expect: FC108

    def context_trtllm(self, q: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
                       max_q_len: int, max_kv_len: int, cum_seq_lens_q: torch.Tensor,
                       cum_seq_lens_kv: torch.Tensor) -> torch.Tensor:
        return trtllm_batch_context_with_kv_cache(
            q, self.pool.kv, self.pool.workspace, block_tables, seq_lens, max_q_len, max_kv_len,
            1.0, 1.0, len(seq_lens), cum_seq_lens_q, cum_seq_lens_kv,
        )

    def decode_trtllm(self, q: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
                      max_seq_len: int) -> torch.Tensor:
        from flashinfer.decode import trtllm_batch_decode_with_kv_cache

        return trtllm_batch_decode_with_kv_cache(
            q, self.pool.kv, self.trtllm_decode_ws, block_tables, seq_lens, max_seq_len,
        )
