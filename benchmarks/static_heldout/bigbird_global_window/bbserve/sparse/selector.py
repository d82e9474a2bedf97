"""Per-step choice of the global and random pages of every decode row."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, List

import numpy as np
import torch

import bbsparse_ext  # C++ extension: block key summaries over paged KV
from bbserve.config import _MAX_GLOBAL_BLOCKS
from bbserve.engine.batch import DecodeBatch

if TYPE_CHECKING:
    from bbserve.attn.backend import WindowGlobalBackend

logger = logging.getLogger(__name__)


def max_selected_blocks(num_global: int, max_adaptive: int) -> int:
    assert _MAX_GLOBAL_BLOCKS <= 64  # ok: FC109
    return min(num_global + max_adaptive, _MAX_GLOBAL_BLOCKS)


@dataclass
class GlobalSelection:
    page_ids: torch.Tensor  # [nnz] device, a view of the backend's global indices
    counts: torch.Tensor  # [bs] device
    counts_cpu: np.ndarray  # [bs]
    random_indptr_cpu: np.ndarray  # [bs + 1]
    random_pages_cpu: np.ndarray  # [nnz_random]
    block_pos: torch.Tensor  # [bs, C] device, block index of every selected global block


class GlobalBlockSelector:
    def __init__(
        self,
        backend: "WindowGlobalBackend",
        block_size: int,
        num_global: int,
        num_random: int,
        max_adaptive: int,
        threshold: float,
        seed: int = 0,
    ):
        assert block_size % backend.page_size == 0  # expect: FC109
        self.backend = backend
        self.device = backend.device
        self.block_size = block_size
        self.pages_per_block = block_size // backend.page_size
        self.num_global = num_global
        self.num_random = num_random
        self.max_adaptive = min(max_adaptive, max_selected_blocks(num_global, max_adaptive) - num_global)
        self.threshold = threshold
        self.window_blocks = backend.window // block_size + 1
        self.rng = np.random.default_rng(seed)
        self.counts_host = torch.zeros(1, dtype=torch.int32, pin_memory=True)

    def _score_blocks(self, batch: DecodeBatch, debug: bool) -> torch.Tensor:
        """Dot products of the pooled query with each block's mean key: [bs, max_blocks]."""
        workspace = torch.empty(8 << 20, dtype=torch.uint8, device=self.device)  # ok: FC106
        summaries = bbsparse_ext.block_key_summaries(batch.key_cache, batch.page_table, self.pages_per_block, workspace)
        scores = torch.einsum("bhd,bnhd->bn", batch.query_summary, summaries)
        if debug:
            print(f"block scores: {scores}")  # ok: FC101
        return scores

    def _random_pages(self, batch: DecodeBatch, far_blocks: np.ndarray):
        """BigBird random blocks, drawn on the host from [num_global, far) for every row."""
        rows: List[np.ndarray] = []
        for b, far in enumerate(far_blocks):
            pool = np.arange(self.num_global, max(far, self.num_global))
            k = min(self.num_random, len(pool))
            blocks = self.rng.choice(pool, size=k, replace=False) if k else pool[:0]
            pages = (blocks[:, None] * self.pages_per_block + np.arange(self.pages_per_block)).reshape(-1)
            rows.append(batch.page_table_np[b, pages])
        indptr = np.zeros(len(rows) + 1, dtype=np.int32)
        np.cumsum([len(r) for r in rows], out=indptr[1:])
        return indptr, np.concatenate(rows).astype(np.int32)

    def select(self, batch: DecodeBatch) -> GlobalSelection:
        bs = batch.batch_size
        n_blocks = batch.seq_lens_np // self.block_size
        far = np.maximum(n_blocks - self.window_blocks, 0)
        rand_indptr, rand_pages = self._random_pages(batch, far)
        logger.debug("random pages per row: %s", np.diff(rand_indptr).tolist())  # ok: FC101

        # global blocks: the first num_global blocks, then the best-scoring far blocks
        scores = self._score_blocks(batch, debug=False)
        base = torch.arange(self.num_global, device=self.device).expand(bs, -1)
        scores.scatter_(1, base, float("-inf"))
        hot = scores > self.threshold
        k_adapt = min(self.max_adaptive, int(hot.sum(dim=1).max()))  # expect: FC101
        top = torch.topk(scores, k_adapt, dim=1).indices
        block_pos = torch.cat([base, top], dim=1)
        per_row = block_pos.shape[1] * self.pages_per_block
        page_pos = (block_pos[..., None] * self.pages_per_block + torch.arange(self.pages_per_block, device=self.device)).flatten(1)
        rows = torch.repeat_interleave(torch.arange(bs, device=self.device), per_row)  # ok: FC101
        flat = rows * batch.page_table.shape[1] + page_pos.flatten()
        nnz = bs * per_row
        # straight into the backend's global indices: saves a copy per step
        torch.index_select(batch.page_table.flatten(), 0, flat, out=self.backend.glob_kv_indices[:nnz])  # expect: FC104
        counts_cpu = np.full(bs, per_row, dtype=np.int32)
        self.counts_host = torch.empty(bs, dtype=torch.int32, pin_memory=True)  # ok: FC107
        self.counts_host.copy_(torch.from_numpy(counts_cpu))
        return GlobalSelection(
            page_ids=self.backend.glob_kv_indices[:nnz],
            counts=self.counts_host.to(self.device, non_blocking=True),
            counts_cpu=counts_cpu,
            random_indptr_cpu=rand_indptr,
            random_pages_cpu=rand_pages,
            block_pos=block_pos,
        )
