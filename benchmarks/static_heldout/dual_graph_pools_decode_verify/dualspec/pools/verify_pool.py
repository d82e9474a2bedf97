"""Target verify pool: graph-mode prefill wrappers (k + 1 query rows per request) over the shared page table."""

import numpy as np
import torch
from flashinfer import BatchPrefillWithPagedKVCacheWrapper

from dualspec.config import SpecConfig
from dualspec.pools.base import GraphPool
from dualspec.shared_bufs import SharedPageBuffers
from specrt.batch import DecodeBatch, VerifyContext

# static inputs the verify graphs read
_VERIFY_INPUTS = ("verify_positions", "verify_token_ids")


class VerifyPool(GraphPool):
    name = "verify"
    WORKSPACE_BYTES = 192 * 1024 * 1024

    def __init__(self, cfg: SpecConfig, shared: SharedPageBuffers, model, device):
        super().__init__(cfg, shared, model, device)
        self.workspace = torch.zeros(self.WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.eager = BatchPrefillWithPagedKVCacheWrapper(self.workspace, cfg.kv_layout)
        n = cfg.verify_width
        rows = cfg.max_batch_size * n
        self.qo_indptr_buf = torch.arange(0, (cfg.max_batch_size + 1) * n, n, dtype=torch.int32, device=device)
        self.verify_positions = torch.zeros(rows, dtype=torch.long, device=device)
        self.verify_token_ids = torch.zeros(rows, dtype=torch.long, device=device)
        self.write_pages = torch.zeros(rows, dtype=torch.long, device=device)
        self.write_offsets = torch.zeros(rows, dtype=torch.long, device=device)

    def _plan_args(self):
        c = self.cfg
        return dict(num_qo_heads=c.num_qo_heads, num_kv_heads=c.num_kv_heads, head_dim_qk=c.head_dim, page_size=c.page_size)

    def _context(self, wrapper, bs: int, token_ids, positions) -> VerifyContext:
        rows = bs * self.cfg.verify_width
        return VerifyContext(
            wrapper=wrapper,
            token_ids=token_ids,
            positions=positions,
            write_pages=self.write_pages[:rows],
            write_offsets=self.write_offsets[:rows],
            bs=bs,
        )

    def _bind(self, bs: int) -> VerifyContext:
        n = self.cfg.verify_width
        w = BatchPrefillWithPagedKVCacheWrapper(
            self.workspace,
            self.cfg.kv_layout,
            use_cuda_graph=True,
            qo_indptr_buf=self.qo_indptr_buf[: bs + 1],
            paged_kv_indptr_buf=self.shared.kv_indptr[: bs + 1],
            paged_kv_indices_buf=self.shared.kv_indices,
            paged_kv_last_page_len_buf=self.shared.verify_last_page[:bs],
        )
        self.wrappers[bs] = w
        qo_host = torch.arange(0, (bs + 1) * n, n, dtype=torch.int32)
        self.shared.kv_indptr_pinned[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
        self.shared.verify_last_page_pinned[:bs] = n
        w.plan(
            qo_host,
            self.shared.kv_indptr_pinned[: bs + 1],
            self.shared.kv_indices[:bs],
            self.shared.verify_last_page_pinned[:bs],
            causal=True,
            **self._plan_args(),
        )
        rows = bs * n
        return self._context(w, bs, self.verify_token_ids[:rows], self.verify_positions[:rows])

    def record(self, bs: int):
        ctx = self._bind(bs)
        for _ in range(2):
            self.model.verify(ctx)
        self.sync_before_capture()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mem_pool):
            out = self.model.verify(ctx)
        self._keep(bs, graph, out)

    def _slots(self, batch: DecodeBatch):
        ps = self.cfg.page_size
        n = self.cfg.verify_width
        pages, offsets = [], []
        for r, base in zip(batch.reqs, batch.seq_lens_np):
            for j in range(n):
                p = int(base) + j
                pages.append(r.page_ids[p // ps])
                offsets.append(p % ps)
        return torch.tensor(pages, dtype=torch.long), torch.tensor(offsets, dtype=torch.long)

    def _pad_rows(self, bs: int, gbs: int):
        # padded rows: one page, one token, so the kernels see a well-formed batch
        self.shared.verify_last_page[bs:gbs].fill_(1)

    def stage(self, batch: DecodeBatch, draft_ids, gbs: int):
        bs = batch.size
        n = self.cfg.verify_width
        if batch.seq_lens.max() + n > self.cfg.max_seq_len:  # expect: FC101
            raise ValueError("the verify window would run past max_seq_len")
        inputs = batch.verify_inputs(draft_ids, n)
        for name in _VERIFY_INPUTS:
            setattr(self, name, getattr(inputs, name).clone())  # expect: FC107
        pages, offsets = self._slots(batch)
        self.write_pages[: bs * n].copy_(pages, non_blocking=True)
        self.write_offsets[: bs * n].copy_(offsets, non_blocking=True)
        indptr_host, last_host = batch.kv_host(n, gbs, self.cfg.page_size)
        self.shared.kv_indptr_pinned[: gbs + 1] = indptr_host
        self.shared.verify_last_page_pinned[:gbs] = last_host
        qo_host = torch.from_numpy(np.arange(0, (gbs + 1) * n, n, dtype=np.int32))
        self.shared.kv_indices[: batch.num_pages].copy_(batch.kv_indices, non_blocking=True)
        # the draft's EAGLE extend over the same verified rows (eager, planned on the host)
        self.shared.extend_wrapper.plan(
            qo_host[: bs + 1],
            self.shared.kv_indptr_pinned[: bs + 1],
            self.shared.kv_indices,
            self.shared.verify_last_page_pinned[:bs],
            causal=True,
            **self._plan_args(),
        )
        w = self.wrappers[gbs]
        w.plan(  # ok: FC102
            qo_host,
            self.shared.kv_indptr_pinned[: gbs + 1],
            self.shared.kv_indices,
            self.shared.verify_last_page_pinned[:gbs],
            causal=True,
            **self._plan_args(),
        )
        self._pad_rows(bs, gbs)  # expect: FC104

    def run_eager(self, batch: DecodeBatch, draft_ids):
        bs = batch.size
        n = self.cfg.verify_width
        inputs = batch.verify_inputs(draft_ids, n)
        pages, offsets = self._slots(batch)
        self.write_pages[: bs * n].copy_(pages, non_blocking=True)
        self.write_offsets[: bs * n].copy_(offsets, non_blocking=True)
        indptr_host, last_host = batch.kv_host(n, bs, self.cfg.page_size)
        qo_host = torch.arange(0, (bs + 1) * n, n, dtype=torch.int32)
        self.eager.plan(qo_host, indptr_host, batch.kv_indices, last_host, causal=True, **self._plan_args())
        self.shared.extend_wrapper.plan(qo_host, indptr_host, batch.kv_indices, last_host, causal=True, **self._plan_args())
        ctx = self._context(self.eager, bs, inputs.verify_token_ids, inputs.verify_positions)
        return self.model.verify(ctx)
