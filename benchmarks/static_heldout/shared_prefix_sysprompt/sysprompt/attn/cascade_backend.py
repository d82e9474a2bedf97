"""Shared-prefix decode.

Eager steps plan a two-level ``MultiLevelCascadeAttentionWrapper`` (level 0: one
row per system prompt, level 1: each request's own pages), or the single-prefix
wrapper when the whole batch shares one prompt. Captured steps run a graph-mode
prefix pass (one query segment per system prompt) and a graph-mode suffix decode,
merged by log-sum-exp.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper, merge_state
from flashinfer.cascade import BatchDecodeWithSharedPrefixPagedKVCacheWrapper, MultiLevelCascadeAttentionWrapper

from sysprompt.attn.workspace import get_workspace
from sysprompt.config import PAGE_SIZE, ServerConfig
from sysprompt.prefix_registry import PrefixRegistry

logger = logging.getLogger(__name__)


@dataclass
class PrefixGroup:
    slot: int
    first_row: int
    num_rows: int


@dataclass
class ForwardBatch:
    batch_size: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    prefix_slot: torch.Tensor
    prefix_slot_cpu: torch.Tensor
    prefix_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    suffix_kv_indptr_cpu: torch.Tensor
    suffix_kv_indices: torch.Tensor
    suffix_last_page_len_cpu: torch.Tensor
    suffix_last_page_len: torch.Tensor
    groups: List[PrefixGroup] = field(default_factory=list)


class CascadeLevels:
    """Level arrays of one eager cascade step."""

    def __init__(self, batch: ForwardBatch, prefix_indptr: np.ndarray, prefix_indices: np.ndarray, device: torch.device) -> None:
        bs = batch.batch_size
        qo_group = torch.zeros(len(batch.groups) + 1, dtype=torch.int32)
        for g, grp in enumerate(batch.groups):
            qo_group[g + 1] = grp.first_row + grp.num_rows
        self.qo_indptr_cpu = [qo_group, torch.arange(bs + 1, dtype=torch.int32)]
        self.prefix_indptr_cpu = torch.from_numpy(prefix_indptr)
        self.prefix_indices = torch.empty(prefix_indices.shape[0], dtype=torch.int32, device=device)  # ok: FC107
        self.prefix_indices.copy_(torch.from_numpy(prefix_indices), non_blocking=True)


def make_prefix_fn(w, kv_cache: torch.Tensor):
    """The prefix pass of one layer as a callable of the query."""

    def run(q: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return w.run_return_lse(q, kv_cache)  # expect: FC108

    return run


def _prefix_capacity(wrapper) -> int:
    return wrapper._paged_kv_indices_buf.numel()  # expect: FC103


class SharedPrefixBackend:
    def __init__(self, cfg: ServerConfig, registry: PrefixRegistry) -> None:
        self.cfg = cfg
        self.registry = registry
        dev = torch.device(cfg.device)
        self.device = dev
        self._kv_layout = "HND"  # ok: FC103
        self.decode_backend = "trtllm-gen" if cfg.sm_major >= 10 else "fa2"
        self.prefix_workspace = torch.zeros(cfg.prefix_workspace_bytes, dtype=torch.uint8, device=dev)  # ok: FC106
        self.legacy_ws = torch.empty(cfg.prefix_workspace_bytes, dtype=torch.uint8, device=dev)  # ok: FC105
        self.cascade_workspace = torch.zeros(cfg.cascade_workspace_bytes, dtype=torch.uint8, device=dev)  # expect: FC106
        self.cascade = MultiLevelCascadeAttentionWrapper(2, self.cascade_workspace, self._kv_layout)
        self.legacy_decode = BatchDecodeWithSharedPrefixPagedKVCacheWrapper(self.legacy_ws, self._kv_layout)
        self.prefix_eager = BatchPrefillWithPagedKVCacheWrapper(self.prefix_workspace, self._kv_layout)

        max_bs = max(cfg.cuda_graph_bs)
        # graph-bound buffers, views of them are bound per captured bs
        self.prefix_qo_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=dev)
        self.prefix_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=dev)
        self.prefix_kv_indices = torch.zeros(cfg.max_prefix_pages, dtype=torch.int32, device=dev)
        self.prefix_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=dev)
        self.suffix_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=dev)
        self.suffix_kv_indices = torch.zeros(cfg.max_suffix_pages, dtype=torch.int32, device=dev)
        self.suffix_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=dev)
        # pinned host mirrors
        self.prefix_qo_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.prefix_kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.prefix_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.suffix_kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.suffix_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        # log-sum-exp of the suffix pass, written inside the graph
        self.merge_lse = torch.zeros(max_bs, cfg.num_qo_heads, dtype=torch.float32, device=dev)

        self.prefix_wrappers: Dict[int, BatchPrefillWithPagedKVCacheWrapper] = {}
        self.suffix_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.graph_bufs: Dict[int, Dict[str, torch.Tensor]] = {}
        self.levels: Optional[CascadeLevels] = None
        self.single_prefix = False
        registry.on_relocate(self._remap_prefix_pages)

    # -------------------------------------------------------------- eager step
    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        cfg = self.cfg
        bs = batch.batch_size
        if len(batch.groups) == 1:
            self.single_prefix = True
            self.legacy_decode.begin_forward(  # ok: FC102
                unique_kv_indptr=batch.suffix_kv_indptr_cpu[: bs + 1],
                unique_kv_indices=batch.suffix_kv_indices,
                unique_kv_last_page_len=batch.suffix_last_page_len_cpu[:bs],
                num_qo_heads=cfg.num_qo_heads,
                num_kv_heads=cfg.num_kv_heads,
                head_dim=cfg.head_dim,
                page_size=PAGE_SIZE,
                data_type=torch.bfloat16,
            )
            return
        self.single_prefix = False
        if torch.unique_consecutive(batch.prefix_slot).numel() != len(batch.groups):  # expect: FC101
            raise ValueError("rows of the batch are not grouped by system prompt")
        indptr_np, indices_np, last_np = self.registry.page_table([g.slot for g in batch.groups])
        levels = CascadeLevels(batch, indptr_np, indices_np, self.device)
        self.levels = levels
        last_lens = []
        last_lens.append(torch.from_numpy(last_np))
        last_lens.append(batch.suffix_last_page_len[:bs])
        self.cascade.plan(  # expect: FC102
            levels.qo_indptr_cpu,
            [levels.prefix_indptr_cpu, batch.suffix_kv_indptr_cpu[: bs + 1]],
            [levels.prefix_indices, batch.suffix_kv_indices],
            last_lens,
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            PAGE_SIZE,
            q_data_type=torch.bfloat16,
        )

    # ---------------------------------------------------------- graph buckets
    def init_forward_metadata_capture_cuda_graph(self, bs: int, batch: ForwardBatch) -> None:
        cfg = self.cfg
        self.prefix_wrappers[bs] = BatchPrefillWithPagedKVCacheWrapper(
            self.prefix_workspace,
            self._kv_layout,
            use_cuda_graph=True,
            qo_indptr_buf=self.prefix_qo_indptr[: bs + 1],
            paged_kv_indptr_buf=self.prefix_kv_indptr[: bs + 1],
            paged_kv_indices_buf=self.prefix_kv_indices,
            paged_kv_last_page_len_buf=self.prefix_last_page_len[:bs],
        )
        bufs = {
            "suffix_kv_indptr": self.suffix_kv_indptr[: bs + 1],
            "suffix_kv_indices": self.suffix_kv_indices,
            "suffix_last_page_len": self.suffix_last_page_len[:bs],
        }
        self.suffix_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
            get_workspace("suffix", cfg.suffix_workspace_bytes, self.device),
            self._kv_layout,
            use_cuda_graph=True,
            paged_kv_indptr_buffer=bufs["suffix_kv_indptr"],
            paged_kv_indices_buffer=bufs["suffix_kv_indices"],
            paged_kv_last_page_len_buffer=bufs["suffix_last_page_len"],
            backend=self.decode_backend,
        )
        bufs["suffix_last_page_len"].fill_(1)  # ok: FC104
        self.graph_bufs[bs] = bufs
        self.init_forward_metadata_replay_cuda_graph(bs, batch)

    def _plan_prefix_graph(self, bs: int, batch: ForwardBatch) -> None:
        cfg = self.cfg
        groups = batch.groups
        g = len(groups)
        indptr_np, indices_np, last_np = self.registry.page_table([grp.slot for grp in groups])
        nnz = int(indptr_np[g])
        if nnz > _prefix_capacity(self.prefix_wrappers[bs]):
            raise RuntimeError(f"{nnz} prefix pages do not fit the bs={bs} graph")
        qo = self.prefix_qo_indptr_cpu
        qo[0] = 0
        for i, grp in enumerate(groups):
            qo[i + 1] = grp.first_row + grp.num_rows
        # unused group slots of the bucket are empty segments
        qo[g + 1 : bs + 1] = batch.batch_size
        kv = self.prefix_kv_indptr_cpu
        kv[: g + 1] = torch.from_numpy(indptr_np)
        kv[g + 1 : bs + 1] = nnz
        self.prefix_last_page_len_cpu[:g] = torch.from_numpy(last_np)
        self.prefix_last_page_len_cpu[g:bs] = 1
        self.prefix_kv_indices[:nnz].copy_(torch.from_numpy(indices_np).pin_memory(), non_blocking=True)  # ok: FC104
        self.prefix_qo_indptr[: bs + 1].copy_(qo[: bs + 1], non_blocking=True)
        self.prefix_kv_indptr[: bs + 1].copy_(kv[: bs + 1], non_blocking=True)
        self.prefix_last_page_len[:bs].copy_(self.prefix_last_page_len_cpu[:bs], non_blocking=True)
        logger.info(f"prefix plan bs={bs}: {g} prompts, first shared length {batch.prefix_lens[0]}")  # expect: FC101
        plan_kw = dict(num_qo_heads=cfg.num_qo_heads, num_kv_heads=cfg.num_kv_heads, head_dim_qk=cfg.head_dim,
                       page_size=PAGE_SIZE, causal=False, q_data_type=torch.bfloat16)
        if bs == 1:
            self.prefix_eager.plan(qo[:2], kv[:2], self.prefix_kv_indices[:nnz], self.prefix_last_page_len_cpu[:1], **plan_kw)  # ok: FC102
        self.prefix_wrappers[bs].plan(  # expect: FC102
            qo_indptr=self.prefix_qo_indptr[: bs + 1],
            paged_kv_indptr=self.prefix_kv_indptr[: bs + 1],
            paged_kv_indices=self.prefix_kv_indices[:nnz],
            paged_kv_last_page_len=self.prefix_last_page_len[:bs],
            **plan_kw,
        )

    def init_forward_metadata_replay_cuda_graph(self, bs: int, batch: ForwardBatch) -> None:
        cfg = self.cfg
        raw_bs = batch.batch_size
        bufs = self.graph_bufs[bs]
        slots, _rows = torch.unique_consecutive(batch.prefix_slot_cpu[:raw_bs], return_counts=True)  # ok: FC101
        if slots.numel() != len(batch.groups):
            raise ValueError("rows of the batch are not grouped by system prompt")
        if int(batch.seq_lens_cpu[:raw_bs].max()) > cfg.max_context:  # ok: FC101
            raise ValueError("a request grew past max_context")
        logger.debug("replay bs=%d raw_bs=%d prefix lens %s", bs, raw_bs, batch.prefix_lens)  # ok: FC101
        self._plan_prefix_graph(bs, batch)
        nnz = int(batch.suffix_kv_indptr_cpu[raw_bs])
        self.suffix_kv_indptr_cpu[: raw_bs + 1] = batch.suffix_kv_indptr_cpu[: raw_bs + 1]
        self.suffix_kv_indptr_cpu[raw_bs + 1 : bs + 1] = nnz
        self.suffix_last_page_len_cpu[:raw_bs] = batch.suffix_last_page_len_cpu[:raw_bs]
        self.suffix_last_page_len_cpu[raw_bs:bs] = 1
        self.suffix_kv_indices[:nnz].copy_(batch.suffix_kv_indices[:nnz])  # ok: FC104
        self.suffix_wrappers[bs].plan(  # ok: FC102
            self.suffix_kv_indptr_cpu[: bs + 1],
            self.suffix_kv_indices[:nnz],
            self.suffix_last_page_len_cpu[:bs],
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            PAGE_SIZE,
            q_data_type=torch.bfloat16,
        )
        bufs["suffix_last_page_len"][raw_bs:].fill_(1)  # expect: FC104
        self.merge_lse = torch.empty(bs, cfg.num_qo_heads, dtype=torch.float32, device=self.device) if bs > self.merge_lse.shape[0] else self.merge_lse  # expect: FC107

    # ---------------------------------------------------------------- forward
    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> torch.Tensor:
        """Captured decode of bucket ``bs``: prefix pass + suffix pass, merged."""
        if bs == 1:
            # a single row needs no segment table: plain prefill over its prompt pages
            prefix_fn = make_prefix_fn(self.prefix_eager, kv_cache)
            o_prefix, lse_prefix = prefix_fn(q)
        else:
            o_prefix, lse_prefix = self.prefix_wrappers[bs].run_return_lse(q, kv_cache)
        o_suffix, lse_suffix = self.suffix_wrappers[bs].run(q, kv_cache, lse=self.merge_lse[:bs], return_lse=True)  # ok: FC108
        out, _ = merge_state(o_prefix, lse_prefix, o_suffix, lse_suffix)
        return out

    def forward_eager(self, q: torch.Tensor, kv_cache: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        if self.single_prefix:
            entry = self.registry.by_slot[batch.groups[0].slot]
            pages = torch.from_numpy(entry.pages).to(self.device, non_blocking=True)
            shared = kv_cache[pages.long()]  # [pages, 2, heads, page, dim]
            k_shared = shared[:, 0].permute(0, 2, 1, 3).reshape(-1, shared.shape[2], shared.shape[4])[: entry.num_tokens]
            v_shared = shared[:, 1].permute(0, 2, 1, 3).reshape(-1, shared.shape[2], shared.shape[4])[: entry.num_tokens]
            return self.legacy_decode.forward(q, k_shared, v_shared, kv_cache)
        return self.cascade.run(q, kv_cache)

    # ----------------------------------------------------------- maintenance
    def _remap_prefix_pages(self, old_pages: np.ndarray, new_pages: np.ndarray) -> None:
        """Registry callback after ``compact``: keep the bound prefix indices pointing at live pages."""
        remap = torch.arange(self.cfg.max_prefix_pages, dtype=torch.int32, device=self.device)
        remap[torch.from_numpy(old_pages).to(self.device)] = torch.from_numpy(new_pages).to(self.device, dtype=torch.int32)
        self.prefix_kv_indices.copy_(remap[self.prefix_kv_indices.long()])  # expect: FC104
