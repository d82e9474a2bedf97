"""Attention over two pools: one eager and one graph wrapper set per layout, a tail wrapper for
requests whose newest pages are still in NHD after moving to HND, trtllm-gen for long HND batches."""

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, merge_state, trtllm_batch_decode_with_kv_cache

from kvlayout.config import _GRAPH_WS_MIB, ServerConfig
from kvlayout.layouts import HND_CODE, KVLayout
from kvlayout.migration import Migrator
from kvlayout.workspace import get_layout_workspace
from layout_attn.batch import LayoutBatch, LayoutMetadata

_KEYS = ("NHD", "HND")


class LayoutAttnBackend:
    def __init__(self, cfg: ServerConfig, pools: dict, migrator: Migrator, device):
        self.cfg = cfg
        self.pools = pools
        self.migrator = migrator
        self.device = device
        self.graph_workspaces = {}
        for layout in KVLayout:
            self.graph_workspaces[layout.value] = torch.zeros(_GRAPH_WS_MIB[layout.value] << 20, dtype=torch.uint8, device=device)  # expect: FC106
        self.nhd_workspace = torch.empty(cfg.eager_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.hnd_workspace = torch.zeros(cfg.eager_workspace_bytes(), dtype=torch.uint8, device=device)
        self.tail_workspace = torch.zeros(cfg.tail_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC106
        self.trtllm_workspace = get_layout_workspace("HND", cfg.trtllm_workspace_bytes(), device)
        self.eager = {
            "NHD": BatchDecodeWithPagedKVCacheWrapper(self.nhd_workspace, "NHD"),
            "HND": BatchDecodeWithPagedKVCacheWrapper(self.hnd_workspace, "HND"),
        }
        self.tail_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.tail_workspace, "NHD")
        self.graph_wrappers = {}

        max_bs = cfg.max_batch_size
        max_pages = max_bs * cfg.max_pages_per_req
        self.graph_indptr = {}
        self.graph_indices = {}
        self.graph_last_page = {}
        self.host_indptr = {}
        self.host_indices = {}
        self.host_last_page = {}
        for key in _KEYS:
            self.graph_indptr[key] = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
            self.graph_indices[key] = torch.zeros(max_pages, dtype=torch.int32, device=device)
            self.graph_last_page[key] = torch.ones(max_bs, dtype=torch.int32, device=device)
            self.host_indptr[key] = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
            self.host_indices[key] = torch.zeros(max_pages, dtype=torch.int32, pin_memory=True)
            self.host_last_page[key] = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.hnd_last_page_gpu = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.hnd_row_hits = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.forward_metadata = None

    def _heads(self) -> dict:
        c = self.cfg
        return dict(num_qo_heads=c.num_qo_heads, num_kv_heads=c.num_kv_heads, head_dim=c.head_dim, page_size=c.page_size)

    def _host_table(self, pages_per_row: list, lens_np: np.ndarray, member: np.ndarray, rows: int):
        """Host indptr / indices / last-page lengths: rows in ``member`` get their pages, the others the trash page."""
        ps = self.cfg.page_size
        lens = np.ones(rows, dtype=np.int32)
        lens[member] = lens_np[member]
        npages = (lens + ps - 1) // ps
        indptr = np.zeros(rows + 1, dtype=np.int32)
        np.cumsum(npages, out=indptr[1:])
        table = [np.zeros(1, dtype=np.int32)] * rows
        for i in member:
            table[i] = np.asarray(pages_per_row[i][: npages[i]], dtype=np.int32)
        last = (lens - (npages - 1) * ps).astype(np.int32)
        return torch.from_numpy(indptr), torch.from_numpy(np.concatenate(table)), torch.from_numpy(last)

    def _tail_table(self, batch: LayoutBatch, rows: int):
        ps = self.cfg.page_size
        member = np.array([i for i, t in enumerate(batch.tail_pages) if len(t) > 0], dtype=np.int64)
        tail_lens = np.array([len(t) * ps for t in batch.tail_pages] + [0] * (rows - batch.size), dtype=np.int32)
        return self._host_table(batch.tail_pages + [[]] * (rows - batch.size), tail_lens, member, rows)

    def _plan_tail(self, batch: LayoutBatch, rows: int):
        indptr, indices, last = self._tail_table(batch, rows)
        self.tail_wrapper.plan(indptr, indices.to(self.device, non_blocking=True), last, **self._heads())

    # ------------------------------------------------------------------ eager steps
    def init_forward_metadata(self, batch: LayoutBatch):
        self.migrator.land_pending()
        bs = batch.size
        hnd_rows = np.flatnonzero(batch.row_layout_np == HND_CODE)  # ok: FC101
        nhd_rows = np.flatnonzero(batch.row_layout_np != HND_CODE)
        indptr, indices, last = self._host_table(batch.pages, batch.seq_lens_np, nhd_rows, bs)
        self.eager["NHD"].plan(  # ok: FC102
            indptr,
            indices.to(self.device, non_blocking=True),
            last,
            **self._heads(),
        )
        indptr, indices, last = self._host_table(batch.pages, batch.seq_lens_np, hnd_rows, bs)
        self.hnd_last_page_gpu[:bs].copy_(last, non_blocking=True)
        self.eager["HND"].plan(  # expect: FC102
            indptr,
            indices.to(self.device, non_blocking=True),
            self.hnd_last_page_gpu[:bs],
            **self._heads(),
        )
        self._plan_tail(batch, bs)
        max_len = int(batch.seq_lens_np.max())
        use_trtllm = self.cfg.use_trtllm_hnd and hnd_rows.shape[0] == bs and max_len >= self.cfg.promote_len
        self.forward_metadata = LayoutMetadata(
            graph_bs=None,
            row_layout=batch.row_layout,
            has_tail=batch.has_tail,
            use_trtllm=use_trtllm,
            seq_lens=batch.seq_lens,
            block_tables=self._block_tables(batch) if use_trtllm else None,
            max_len=max_len,
        )

    def _block_tables(self, batch: LayoutBatch):
        pool = self.pools[KVLayout.HND]
        rows = [pool.assign_row(rid) for rid in batch.rids]
        return pool.req_to_page[torch.tensor(rows, dtype=torch.int64).to(self.device, non_blocking=True)]

    # ------------------------------------------------------------------ graphs
    def init_forward_metadata_capture_cuda_graph(self, bs: int, batch: LayoutBatch):
        for key in _KEYS:
            w = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspaces[key],
                key,
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.graph_indptr[key][: bs + 1],
                paged_kv_indices_buffer=self.graph_indices[key],
                paged_kv_last_page_len_buffer=self.graph_last_page[key][:bs],
            )
            self.graph_wrappers[(key, bs)] = w
            self.host_indptr[key][: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
            self.host_last_page[key][:bs] = 1
            w.plan(self.host_indptr[key][: bs + 1], self.graph_indices[key], self.host_last_page[key][:bs], **self._heads())
        self._plan_tail(batch, bs)
        self.forward_metadata = LayoutMetadata(graph_bs=bs, row_layout=batch.row_layout, has_tail=True)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, batch: LayoutBatch, seq_lens, row_layout):
        self.migrator.land_pending()
        hnd_rows = torch.nonzero(row_layout[:bs] == HND_CODE).flatten()  # expect: FC101
        self.hnd_row_hits[hnd_rows] += 1
        lens_np = np.ones(bs, dtype=np.int32)
        lens_np[: batch.size] = batch.seq_lens_np
        pages = batch.pages + [[0]] * (bs - batch.size)
        tables = {
            "NHD": self._host_table(pages, lens_np, np.flatnonzero(batch.row_layout_np != HND_CODE), bs),
            "HND": self._host_table(pages, lens_np, np.flatnonzero(batch.row_layout_np == HND_CODE), bs),
        }
        for key, (indptr, indices, last) in tables.items():
            n = indices.shape[0]
            self.host_indptr[key][: bs + 1] = indptr
            self.host_last_page[key][:bs] = last
            self.host_indices[key][:n] = indices
            self.graph_indices[key][:n].copy_(self.host_indices[key][:n], non_blocking=True)  # ok: FC104
        self._plan_tail(batch, bs)
        nhd_kw = dict(
            indptr=self.host_indptr["NHD"][: bs + 1],
            indices=self.graph_indices["NHD"],
            last_page_len=self.host_last_page["NHD"][:bs],
            **self._heads(),
        )
        hnd_kw = dict(
            indptr=self.host_indptr["HND"][: bs + 1],
            indices=self.graph_indices["HND"],
            last_page_len=self.host_last_page["HND"][:bs],
            **self._heads(),
        )
        self.graph_wrappers[("NHD", bs)].plan(**nhd_kw)
        self.graph_wrappers[("HND", bs)].plan(**hnd_kw)  # ok: FC102
        # the HND kernels want lengths on the device too: derive them from the step's device lengths
        torch.remainder(seq_lens[:bs] - 1, self.cfg.page_size, out=self.graph_last_page["HND"][:bs])  # expect: FC104

    def retarget(self, key: str, layout: KVLayout):
        """After a pool was converted offline, point its eager wrapper at the new layout instead of rebuilding it."""
        self.eager[key]._kv_layout = layout.value  # expect: FC103

    # ------------------------------------------------------------------ forward
    def forward_decode(self, q, layer_id: int):
        md = self.forward_metadata
        outs = {}
        for key in _KEYS:
            cache = self.pools[KVLayout(key)].caches[layer_id]
            if md.graph_bs is not None:
                w = self.graph_wrappers[(key, md.graph_bs)]
            else:
                w = self.eager[key]
            outs[key] = w.run_return_lse(q, cache)  # ok: FC108
        o_nhd, lse_nhd = outs["NHD"]
        o_hnd, lse_hnd = outs["HND"]
        if md.has_tail:
            nhd_cache = self.pools[KVLayout.NHD].caches[layer_id]
            o_tail, lse_tail = self.tail_wrapper.run_return_lse(q, nhd_cache)  # expect: FC108
            o_hnd, lse_hnd = merge_state(o_hnd, lse_hnd, o_tail, lse_tail)
        use_hnd = (md.row_layout == HND_CODE).view(-1, 1, 1)
        return torch.where(use_hnd, o_hnd, o_nhd)

    def forward_decode_long(self, q, layer_id: int):
        md = self.forward_metadata
        cache = self.pools[KVLayout.HND].caches[layer_id]
        return trtllm_batch_decode_with_kv_cache(q, cache, self.trtllm_workspace, md.block_tables, md.seq_lens, md.max_len)
