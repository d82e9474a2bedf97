"""Two-level attention for n completions per prompt.

Level 0 is the prompt's full pages, shared by every completion of a group (one query row per completion,
non-causal); level 1 is each completion's own pages (the copy of the prompt's partial last page, then what it
generated).  Large batches run both levels through FlashInfer's ``MultiLevelCascadeAttentionWrapper``; batches
that fit a graph bucket replay a captured decode of the unique-suffix level merged with the prefix level.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    MultiLevelCascadeAttentionWrapper,
    merge_state,
)
from flashinfer.prefill import trtllm_batch_context_with_kv_cache

from nbest.config import NBestConfig

PAD_PAGE = 0  # never handed out; padded graph rows read it


def fill_pad(buf: torch.Tensor, start: int, end: int) -> None:
    buf[start:end] = PAD_PAGE


@dataclass
class CascadeBatch:
    """One decode step over every live completion, rows ordered by group."""

    num_seqs: int
    num_groups: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    group_qo_indptr_cpu: torch.Tensor
    prefix_kv_indptr_cpu: torch.Tensor
    prefix_indices: torch.Tensor
    prefix_lens: torch.Tensor
    prefix_last_cpu: torch.Tensor
    suffix_kv_indptr_cpu: torch.Tensor
    suffix_indices: torch.Tensor
    suffix_last_cpu: torch.Tensor
    suffix_lens: torch.Tensor
    suffix_lens_cpu: torch.Tensor
    suffix_nnz: int


@dataclass
class SuffixView:
    """The slice of the bound suffix buffers one replay uses."""

    indptr: torch.Tensor
    last_page_len: torch.Tensor


class CascadeBackend:
    CASCADE_WORKSPACE_BYTES = 192 * 1024 * 1024

    def __init__(self, cfg: NBestConfig, device: torch.device) -> None:
        self.cfg = cfg
        self.device = device
        self.shape = (cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size)
        self.prefill_backend = "trtllm-gen" if cfg.sm_version >= 100 else "fa2"
        prefill_bytes = cfg.max_prefill_tokens * cfg.num_qo_heads * (cfg.head_dim + 1) * 8
        self.cascade_workspace = torch.zeros(self.CASCADE_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.prefill_workspace = torch.empty(prefill_bytes, dtype=torch.uint8, device=device)  # ok: FC105
        graph_bytes = cfg.max_num_seqs * cfg.max_pages_per_seq * cfg.num_qo_heads * 8
        self.graph_workspace = torch.zeros(graph_bytes, dtype=torch.uint8, device=device)
        self.context_workspace: Optional[torch.Tensor] = None
        if self.prefill_backend == "trtllm-gen":
            self.context_workspace = torch.empty(prefill_bytes, dtype=torch.uint8, device=device)  # expect: FC105

        self.cascade = MultiLevelCascadeAttentionWrapper(2, self.cascade_workspace, "NHD")
        self.prefix_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, "NHD", backend="fa2")
        self.prompt_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, "NHD", backend="fa2")
        self.prefix_lens_seen = torch.zeros(cfg.max_groups, dtype=torch.int32, device=device)

        max_bs, max_pages = cfg.graph_bs[-1], cfg.graph_bs[-1] * cfg.max_pages_per_seq
        self.suffix_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.suffix_indices = torch.zeros(max_pages, dtype=torch.int32, device=device)
        self.suffix_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.suffix_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.suffix_indices_cpu = torch.zeros(max_pages, dtype=torch.int32, pin_memory=True)
        self.suffix_last_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.suffix_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        # block tables for the trtllm-gen context kernel (prompt prefill on Blackwell)
        self.block_tables = torch.zeros(cfg.max_groups, cfg.max_pages_per_seq, dtype=torch.int32, device=device)

    # ------------------------------------------------------------------ planning (per step)
    def plan_prefix(self, batch: CascadeBatch) -> None:
        """Level 0 changes only when groups join or leave: skip the plan when the prefix lengths match."""
        ng = batch.num_groups
        if torch.equal(self.prefix_lens_seen[:ng], batch.prefix_lens):  # expect: FC101
            return
        self.prefix_lens_seen[:ng].copy_(batch.prefix_lens)
        self.prefix_wrapper.plan(  # ok: FC102
            batch.group_qo_indptr_cpu, batch.prefix_kv_indptr_cpu, batch.prefix_indices, batch.prefix_last_cpu,
            *self.shape, causal=False, q_data_type=torch.bfloat16,
        )

    def plan_cascade(self, batch: CascadeBatch) -> None:
        bs = batch.num_seqs
        max_suffix = int(batch.suffix_lens_cpu.max())  # ok: FC101
        if max_suffix > self.cfg.max_new_tokens + self.cfg.page_size:
            raise RuntimeError(f"suffix of {max_suffix} tokens exceeds max_new_tokens={self.cfg.max_new_tokens}")
        qo_indptr_arr = [batch.group_qo_indptr_cpu, torch.arange(bs + 1, dtype=torch.int32, device=self.device)]
        self.cascade.plan(  # expect: FC102
            qo_indptr_arr,
            [batch.prefix_kv_indptr_cpu, batch.suffix_kv_indptr_cpu],
            [batch.prefix_indices, batch.suffix_indices],
            [batch.prefix_last_cpu, batch.suffix_last_cpu],
            *self.shape,
            causal=False,
            q_data_type=torch.bfloat16,
        )

    def plan_prompt(self, qo_indptr_cpu, kv_indptr_cpu, indices, last_cpu) -> None:
        self.prompt_wrapper.plan(
            qo_indptr_cpu, kv_indptr_cpu, indices, last_cpu, *self.shape, causal=True, q_data_type=torch.bfloat16
        )

    # ------------------------------------------------------------------ unique-suffix graphs
    def bind_suffix_wrapper(self, bs: int) -> None:
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.graph_workspace,
            "NHD",
            use_cuda_graph=True,
            paged_kv_indptr_buffer=self.suffix_indptr[: bs + 1],
            paged_kv_indices_buffer=self.suffix_indices,
            paged_kv_last_page_len_buffer=self.suffix_last_page_len[:bs],
            backend="fa2",
        )
        w.plan(  # ok: FC102
            torch.arange(bs + 1, dtype=torch.int32), self.suffix_indices[:bs], torch.ones(bs, dtype=torch.int32),
            *self.shape, q_data_type=torch.bfloat16,
        )
        self.suffix_wrappers[bs] = w

    def load_suffix_graph(self, batch: CascadeBatch, bs: int) -> None:
        raw, nnz = batch.num_seqs, batch.suffix_nnz
        w = self.suffix_wrappers[bs]
        if nnz + bs - raw > w._paged_kv_indices_buf.numel():  # expect: FC103
            raise RuntimeError(f"{nnz} suffix pages do not fit the graph buffer of bucket {bs}")
        max_suffix = int(batch.suffix_lens.max())  # expect: FC101
        if max_suffix > self.cfg.max_new_tokens + self.cfg.page_size:
            raise RuntimeError(f"suffix of {max_suffix} tokens exceeds max_new_tokens={self.cfg.max_new_tokens}")
        self.suffix_indptr_cpu[: raw + 1] = batch.suffix_kv_indptr_cpu
        self.suffix_indptr_cpu[raw + 1 : bs + 1] = nnz + torch.arange(1, bs - raw + 1, dtype=torch.int32)
        fill_pad(self.suffix_indices_cpu, nnz, nnz + bs - raw)
        self.suffix_last_cpu[:raw] = batch.suffix_last_cpu
        self.suffix_indices[:nnz].copy_(batch.suffix_indices[:nnz], non_blocking=True)  # ok: FC104
        view = SuffixView(self.suffix_indptr[: bs + 1], self.suffix_last_page_len[:bs])
        view.last_page_len[:raw].copy_(self.suffix_last_cpu[:raw], non_blocking=True)
        w.plan(  # expect: FC102
            self.suffix_indptr_cpu[: bs + 1], self.suffix_indices[: nnz + bs - raw], view.last_page_len,
            *self.shape, q_data_type=torch.bfloat16,
        )
        view.last_page_len[raw:].fill_(1)  # expect: FC104

    def reset_graph_inputs(self) -> None:
        """Every group finished: park the graph rows on the padding page until the next plan."""
        fill_pad(self.suffix_indices, 0, self.suffix_indices.numel())  # expect: FC104
        bound = (self.suffix_indptr, self.suffix_last_page_len)
        for buf, mirror in zip(bound, (self.suffix_indptr_cpu, self.suffix_last_cpu)):
            mirror[: buf.numel()].zero_()  # ok: FC104

    # ------------------------------------------------------------------ attention
    def forward_graph(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        o_prefix, lse_prefix = self.prefix_wrapper.run(q, kv_cache, return_lse=True)  # expect: FC108
        o_suffix, lse_suffix = self.suffix_wrappers[q.shape[0]].run(q, kv_cache, return_lse=True)  # ok: FC108
        o, _ = merge_state(o_prefix, lse_prefix, o_suffix, lse_suffix)
        return o

    def forward_cascade(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.cascade.run(q, kv_cache)

    def forward_prompt(self, q: torch.Tensor, kv_cache: torch.Tensor, meta) -> torch.Tensor:
        if self.prefill_backend != "trtllm-gen":
            return self.prompt_wrapper.run(q, kv_cache)
        return trtllm_batch_context_with_kv_cache(
            query=q,
            kv_cache=kv_cache,
            workspace_buffer=self.context_workspace,
            block_tables=self.block_tables[: meta.num_groups],
            seq_lens=meta.seq_lens,
            max_q_len=meta.max_q_len,
            max_kv_len=meta.max_q_len,
            bmm1_scale=self.cfg.head_dim**-0.5,
            bmm2_scale=1.0,
            batch_size=meta.num_groups,
            cum_seq_lens_q=meta.cu_seqlens,
            cum_seq_lens_kv=meta.cu_seqlens,
        )
