"""Draft decode pool: graph-mode decode wrappers per batch size over the shared page table."""

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from dualspec.config import SpecConfig
from dualspec.pools.base import GraphPool
from dualspec.shared_bufs import SharedPageBuffers
from dualspec.workspaces import pool_workspace
from specrt.batch import DecodeBatch, DraftContext


class DraftDecodePool(GraphPool):
    name = "draft"

    def __init__(self, cfg: SpecConfig, shared: SharedPageBuffers, model, device):
        assert cfg.num_draft_tokens <= cfg.max_draft_tokens  # expect: FC109
        super().__init__(cfg, shared, model, device)
        self.backend_name = "trtllm-gen" if cfg.sm_major >= 10 else "fa2"
        self.workspace = pool_workspace(self.name, cfg.draft_workspace_bytes(), str(device))
        eager_ws = torch.empty(cfg.draft_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        eager_ws.zero_()
        self.eager = BatchDecodeWithPagedKVCacheWrapper(eager_ws, cfg.kv_layout, backend=self.backend_name)
        max_bs = cfg.max_batch_size
        self.last_page_pinned = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.input_buf = torch.zeros(max_bs, dtype=torch.long, device=device)
        self.hidden_buf = torch.zeros(max_bs, cfg.hidden, dtype=torch.float16, device=device)
        self.positions_buf = torch.zeros(max_bs, dtype=torch.long, device=device)
        self.write_pages = torch.zeros(max_bs, dtype=torch.long, device=device)
        self.write_offsets = torch.zeros(max_bs, dtype=torch.long, device=device)
        self.token_buf = torch.zeros(max_bs, cfg.num_draft_tokens + 1, dtype=torch.long, device=device)

    def _heads(self):
        c = self.cfg
        return c.num_qo_heads, c.num_kv_heads, c.head_dim, c.page_size

    def _context(self, wrapper, bs: int) -> DraftContext:
        return DraftContext(
            wrapper=wrapper,
            input_ids=self.input_buf[:bs],
            hidden=self.hidden_buf[:bs],
            positions=self.positions_buf[:bs],
            write_pages=self.write_pages[:bs],
            write_offsets=self.write_offsets[:bs],
        )

    def _bind(self, bs: int) -> DraftContext:
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.workspace,
            self.cfg.kv_layout,
            use_cuda_graph=True,
            paged_kv_indptr_buffer=self.shared.kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.shared.kv_indices,
            paged_kv_last_page_len_buffer=self.shared.draft_last_page[:bs],
            backend=self.backend_name,
        )
        self.wrappers[bs] = w
        self.shared.draft_last_page[:bs].fill_(1)  # ok: FC104
        self.last_page_pinned[:bs] = 1
        self.shared.kv_indptr_pinned[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
        w.plan(self.shared.kv_indptr_pinned[: bs + 1], self.shared.kv_indices[:bs], self.last_page_pinned[:bs], *self._heads())
        return self._context(w, bs)

    def record(self, bs: int):
        ctx = self._bind(bs)
        for _ in range(2):
            self.model.forward_draft(ctx)
        self.sync_before_capture()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mem_pool):
            out = self.model.forward_draft(ctx)
        self._keep(bs, graph, out)

    def _slots(self, batch: DecodeBatch, depth: int):
        ps = self.cfg.page_size
        pos = batch.seq_lens_np + depth
        pages = np.array([r.page_ids[p // ps] for r, p in zip(batch.reqs, pos)], dtype=np.int64)
        return torch.from_numpy(pages), torch.from_numpy((pos % ps).astype(np.int64))

    def stage(self, batch: DecodeBatch, gbs: int, depth: int):
        bs = batch.size
        indptr_host, last_host = batch.kv_host(depth + 1, gbs, self.cfg.page_size)
        self.shared.kv_indptr_pinned[: gbs + 1] = indptr_host
        self.last_page_pinned[:gbs] = last_host
        pages, offsets = self._slots(batch, depth)
        self.write_pages[:bs].copy_(pages, non_blocking=True)
        self.write_offsets[:bs].copy_(offsets, non_blocking=True)
        self.shared.kv_indices[: batch.num_pages].copy_(batch.kv_indices, non_blocking=True)
        self.shared.kv_indptr[: gbs + 1].copy_(self.shared.kv_indptr_pinned[: gbs + 1], non_blocking=True)  # ok: FC104
        w = self.wrappers[gbs]
        w.plan(  # ok: FC102
            self.shared.kv_indptr_pinned[: gbs + 1],
            self.shared.kv_indices,
            self.last_page_pinned[:gbs],
            *self._heads(),
        )

    def stage_eager(self, batch: DecodeBatch, depth: int) -> DraftContext:
        bs = batch.size
        _, last_host = batch.kv_host(depth + 1, bs, self.cfg.page_size)
        self.eager.plan(  # expect: FC102
            batch.kv_indptr,
            batch.kv_indices,
            last_host,
            *self._heads(),
        )
        pages, offsets = self._slots(batch, depth)
        self.write_pages[:bs].copy_(pages, non_blocking=True)
        self.write_offsets[:bs].copy_(offsets, non_blocking=True)
        return self._context(self.eager, bs)
