"""FlashInfer tree attention for EAGLE-3.

Verification: the target model runs the whole tree (``T`` tokens per request) in one pass; a paged prefill
wrapper with a packed custom mask lets every node see the context, its ancestors and itself. Chain-shaped trees
on Blackwell use trtllm-gen's context kernel instead (the mask is then plain causal).

Drafting: level 0 re-runs the draft layer over the tokens accepted by the last verification (causal); level
``d`` runs the tree nodes at depth ``d``, each attending to the context and to its drafted ancestors. Levels
run eagerly, or inside a draft CUDA graph per batch size with one graph-mode wrapper per level bound to row
``d`` of the ``g_*`` buffers.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from flashinfer import BatchPrefillWithPagedKVCacheWrapper
from flashinfer.prefill import trtllm_batch_context_with_kv_cache

from eagle3spec.tree import MASK_BUF_ATTR, SpecConfig, SpecTree, WorkspaceSize


@dataclass
class CommonAttentionMetadata:
    query_start_loc: torch.Tensor
    query_start_loc_cpu: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    block_table_tensor: torch.Tensor
    block_table_cpu: torch.Tensor
    num_reqs: int
    num_actual_tokens: int


@dataclass
class TreeAttentionMetadata:
    num_reqs: int
    tree_size: int
    wrapper: Optional[BatchPrefillWithPagedKVCacheWrapper]
    level_wrappers: List[BatchPrefillWithPagedKVCacheWrapper]
    chain: bool = False
    block_table: Optional[torch.Tensor] = None
    seq_lens: Optional[torch.Tensor] = None
    cum_seq_lens_q: Optional[torch.Tensor] = None
    cum_seq_lens_kv: Optional[torch.Tensor] = None
    max_kv_len: int = 0


@functools.lru_cache(maxsize=4)
def get_chain_workspace(device: str, nbytes: int) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105


def _pack_rows(rows: List[np.ndarray]) -> np.ndarray:
    if not rows:
        return np.zeros(0, dtype=np.uint8)
    return np.packbits(np.concatenate([r.reshape(-1) for r in rows]), bitorder="little")


class FlashInferTreeMetadataBuilder:
    def __init__(
        self, spec_cfg: SpecConfig, tree: SpecTree, num_heads: int, num_kv_heads: int, head_dim: int,
        page_size: int, max_num_reqs: int, max_model_len: int, device: str = "cuda",
    ) -> None:
        self.tree = tree
        self.T = tree.num_nodes
        self.depth = tree.max_depth
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.page_size = page_size
        self.max_num_reqs = max_num_reqs
        self.max_model_len = max_model_len
        self.device = device
        self._sm_scale = head_dim**-0.5
        self._kv_layout = "NHD"
        self.max_pages = (max_model_len + self.T + page_size - 1) // page_size

        verify_ws = max_num_reqs * self.T * num_heads * (head_dim + 1) * 4 * 8
        self.tree_workspace = torch.empty(verify_ws, dtype=torch.uint8, device=device)  # ok: FC105
        self.tree_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.tree_workspace, self._kv_layout, backend="fa2")

        self.draft_workspace = torch.zeros(spec_cfg.draft_workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        self.first_step_wrapper = BatchPrefillWithPagedKVCacheWrapper(
            self.draft_workspace, self._kv_layout, backend="fa2"
        )
        self.level_wrappers = [
            BatchPrefillWithPagedKVCacheWrapper(self.draft_workspace, self._kv_layout, backend="fa2")
            for _ in range(self.depth)
        ]

        self.chain = spec_cfg.use_trtllm_chain and tree.is_chain
        self.chain_workspace = (
            get_chain_workspace(device, max_num_reqs * num_heads * 64 * 1024) if self.chain else None
        )

        # draft levels in CUDA graphs: row d of every buffer belongs to level d (row 0 is unused)
        rows = self.depth + 1
        self.graph_workspace = torch.zeros(WorkspaceSize.DRAFT_GRAPH, dtype=torch.uint8, device=device)  # expect: FC106
        self.g_qo_indptr = torch.zeros(rows, max_num_reqs + 1, dtype=torch.int32, device=device)
        self.g_kv_indptr = torch.zeros(rows, max_num_reqs + 1, dtype=torch.int32, device=device)
        self.g_kv_indices = torch.zeros(rows, max_num_reqs * self.max_pages, dtype=torch.int32, device=device)
        self.g_last_page_len = torch.zeros(rows, max_num_reqs, dtype=torch.int32, device=device)
        mask_bytes = (max_num_reqs * self.T * (max_model_len + self.T) + 7) // 8
        self.g_custom_mask = torch.zeros(rows, mask_bytes, dtype=torch.uint8, device=device)
        self.g_mask_indptr = torch.zeros(rows, max_num_reqs + 1, dtype=torch.int32, device=device)
        self.draft_graph_wrappers: Dict[Tuple[int, int], BatchPrefillWithPagedKVCacheWrapper] = {}

    # ------------------------------------------------------------------ host tables

    def _paged_tables(self, kv_lens: np.ndarray, n: int, block_table_cpu: torch.Tensor):
        pages = (kv_lens + self.page_size - 1) // self.page_size
        kv_indptr = np.zeros(kv_lens.shape[0] + 1, dtype=np.int32)
        np.cumsum(pages, out=kv_indptr[1:])
        table = block_table_cpu.numpy()
        # padded rows (i >= n) read page 0, the engine's scratch page
        kv_indices = np.concatenate(
            [table[i, : pages[i]] if i < n else np.zeros(pages[i], np.int32) for i in range(kv_lens.shape[0])]
        ).astype(np.int32)
        last = (kv_lens - (pages - 1) * self.page_size).astype(np.int32)
        return torch.from_numpy(kv_indptr), torch.from_numpy(kv_indices), torch.from_numpy(last)

    def _level_tables(self, depth: int, rows: int, n: int, seq_lens_cpu: torch.Tensor, block_table_cpu: torch.Tensor):
        width = self.tree.level_width(depth)
        before = self.tree.nodes_before(depth)
        ctx = seq_lens_cpu[:n].numpy().astype(np.int64)
        kv_lens = np.concatenate([ctx + before + width, np.full(rows - n, 1 + before + width, dtype=np.int64)])
        qo = torch.arange(0, (rows + 1) * width, width, dtype=torch.int32)
        kv_indptr, kv_indices, last = self._paged_tables(kv_lens, n, block_table_cpu)
        anc = self.tree.mask[self.tree.level_nodes[depth]][:, 1 : before + width + 1]
        masks = [np.concatenate([np.ones((width, int(L) - before - width), bool), anc], axis=1) for L in kv_lens]
        return qo, kv_indptr, kv_indices, last, torch.from_numpy(_pack_rows(masks))

    def _verify_mask(self, seq_lens: np.ndarray, total_bits: int) -> np.ndarray:
        out = np.zeros((total_bits + 7) // 8, dtype=np.uint8)
        rows = [np.concatenate([np.ones((self.T, L - self.T), bool), self.tree.mask], axis=1) for L in seq_lens.tolist()]
        packed = _pack_rows(rows)
        out[: packed.size] = packed
        return out

    # ------------------------------------------------------------------ verification (every step)

    def build(self, common_prefix_len: int, common: CommonAttentionMetadata) -> TreeAttentionMetadata:
        n, T = common.num_reqs, self.T
        max_kv = int(common.seq_lens_cpu[:n].max())  # ok: FC101
        if max_kv > self.max_model_len + T:
            raise ValueError(f"a request holds {max_kv} tokens, more than max_model_len + tree size")
        total_bits = int((common.seq_lens[:n] * T).sum())  # expect: FC101
        seq_lens = common.seq_lens_cpu[:n].numpy().astype(np.int64)
        kv_indptr, kv_indices, last = self._paged_tables(seq_lens, n, common.block_table_cpu)
        packed = torch.from_numpy(self._verify_mask(seq_lens, total_bits))
        self.tree_wrapper.plan(  # expect: FC102
            common.query_start_loc[: n + 1],
            kv_indptr,
            kv_indices,
            last,
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            self.page_size,
            packed_custom_mask=packed.to(self.device, non_blocking=True),
            sm_scale=self._sm_scale,  # ok: FC103
        )
        meta = TreeAttentionMetadata(n, T, self.tree_wrapper, self.level_wrappers)
        if self.chain:
            meta.chain = True
            meta.block_table = common.block_table_tensor[:n]
            meta.seq_lens = common.seq_lens[:n]
            meta.cum_seq_lens_q = common.query_start_loc[: n + 1]
            meta.cum_seq_lens_kv = torch.cumsum(F.pad(common.seq_lens[:n], (1, 0)), 0, dtype=torch.int32)
            meta.max_kv_len = max_kv
        return meta

    # ------------------------------------------------------------------ drafting

    def _plan_first_step(self, rows: int, n: int, seq_lens_cpu: torch.Tensor, block_table_cpu: torch.Tensor) -> None:
        q0 = self.depth + 1
        ctx = seq_lens_cpu[:n].numpy().astype(np.int64)
        kv_lens = np.concatenate([ctx, np.full(rows - n, q0, dtype=np.int64)])
        kv_indptr, kv_indices, last = self._paged_tables(kv_lens, n, block_table_cpu)
        qo = torch.arange(0, (rows + 1) * q0, q0, dtype=torch.int32)
        self.first_step_wrapper.plan(
            qo,
            kv_indptr,
            kv_indices,
            last,
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            self.page_size,
            causal=True,
            sm_scale=self._sm_scale,
        )

    def build_draft(self, n: int, common: CommonAttentionMetadata) -> TreeAttentionMetadata:
        self._plan_first_step(n, n, common.seq_lens_cpu, common.block_table_cpu)
        for depth in range(1, self.depth + 1):
            qo, kv_indptr, kv_indices, last, packed = self._level_tables(
                depth, n, n, common.seq_lens_cpu, common.block_table_cpu
            )
            self.level_wrappers[depth - 1].plan(  # ok: FC102
                qo,
                kv_indptr,
                kv_indices,
                last,
                self.num_heads,
                self.num_kv_heads,
                self.head_dim,
                self.page_size,
                packed_custom_mask=packed.to(self.device, non_blocking=True),
                sm_scale=self._sm_scale,
            )
        return TreeAttentionMetadata(n, self.T, None, self.level_wrappers)

    def init_draft_graph_buffers(self) -> None:
        self.g_last_page_len.fill_(1)  # ok: FC104
        self.g_qo_indptr.zero_()
        self.g_kv_indptr.zero_()

    def build_for_cudagraph_capture(self, bs: int) -> TreeAttentionMetadata:
        wrappers = []
        for depth in range(1, self.depth + 1):
            w = BatchPrefillWithPagedKVCacheWrapper(
                self.graph_workspace,
                self._kv_layout,
                use_cuda_graph=True,
                qo_indptr_buf=self.g_qo_indptr[depth, : bs + 1],
                paged_kv_indptr_buf=self.g_kv_indptr[depth, : bs + 1],
                paged_kv_indices_buf=self.g_kv_indices[depth],
                paged_kv_last_page_len_buf=self.g_last_page_len[depth, :bs],
                custom_mask_buf=self.g_custom_mask[depth],
                mask_indptr_buf=self.g_mask_indptr[depth, : bs + 1],
                backend="fa2",
            )
            needed_bits = bs * self.tree.level_width(depth) * (self.max_model_len + self.T)
            if getattr(w, MASK_BUF_ATTR).numel() * 8 < needed_bits:  # expect: FC103
                raise ValueError(f"draft mask buffer too small for bs={bs} at level {depth}")
            self.draft_graph_wrappers[(bs, depth)] = w
            wrappers.append(w)
        return TreeAttentionMetadata(bs, self.T, None, wrappers)

    def prepare_draft_replay(self, bs: int, n: int, seq_lens_cpu: torch.Tensor, block_table_cpu: torch.Tensor) -> None:
        self._plan_first_step(bs, n, seq_lens_cpu, block_table_cpu)
        for depth in range(1, self.depth + 1):
            w = self.draft_graph_wrappers[(bs, depth)]
            qo, kv_indptr, kv_indices, last, packed = self._level_tables(depth, bs, n, seq_lens_cpu, block_table_cpu)
            self.g_kv_indices[depth, : kv_indices.numel()].copy_(kv_indices, non_blocking=True)  # ok: FC104
            w.plan(  # ok: FC102
                qo,
                kv_indptr,
                kv_indices,
                last,
                self.num_heads,
                self.num_kv_heads,
                self.head_dim,
                self.page_size,
                packed_custom_mask=packed.to(self.device, non_blocking=True),
                sm_scale=self._sm_scale,
            )


def verify_attention(
    q: torch.Tensor, kv_cache: torch.Tensor, meta: TreeAttentionMetadata, builder: FlashInferTreeMetadataBuilder,
) -> torch.Tensor:
    """Called by the target model's attention layers during the verification forward."""
    if meta.chain:
        return trtllm_batch_context_with_kv_cache(
            q,
            kv_cache,
            builder.chain_workspace,
            meta.block_table,
            meta.seq_lens,
            meta.tree_size,
            meta.max_kv_len,
            builder.head_dim**-0.5,
            1.0,
            meta.num_reqs,
            meta.cum_seq_lens_q,
            meta.cum_seq_lens_kv,
        )
    return meta.wrapper.run(q, kv_cache)
