"""Hooks between the engine and the distributed KV store.

* ``match_prefixes``: one batched ``exists`` for every new request's page keys; the leading run of hits is the
  prefix the store can hand back,
* ``load_prefix_hits``: before the prefill, get those pages into registered pinned memory and copy them into the
  local pages allocated for them (on a load stream),
* ``write_back``: after a decode step, queue every page that just filled up for a put; a writer thread does the
  device-to-host copy and the put off the step.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import TYPE_CHECKING, Callable, List, Optional

import flashcheck
import numpy as np
import torch

from kvserve.metadata import DecodeMetadata
from kvserve.page_pool import LocalPagePool
from kvstore import MooncakeStoreClient, StoreConfig, hex_keys, page_hashes

if TYPE_CHECKING:
    from kvserve.engine import Request

logger = logging.getLogger(__name__)


class KVStoreConnector:
    def __init__(
        self,
        cfg: StoreConfig,
        store: MooncakeStoreClient,
        pool: LocalPagePool,
        key_of_page: Callable[[int, int], Optional[str]],
        device: torch.device,
    ) -> None:
        self.cfg = cfg
        self.store = store
        self.pool = pool
        self.key_of_page = key_of_page
        self.device = device
        self.protocol = store.transfer._backend  # ok: FC103
        self.load_stream = torch.cuda.Stream(device)
        self.load_event = torch.cuda.Event()
        self._load_done = self.load_event
        self._pending: "queue.Queue[Optional[tuple]]" = queue.Queue()
        self._writer = threading.Thread(target=self._writer_loop, name="kv-store-writer", daemon=True)
        self._writer.start()
        self.pages_loaded = 0

    # ---------------------------------------------------------------- lookup

    def match_prefixes(self, reqs: List["Request"]) -> None:
        """Key every full prompt page; the hits are the leading run the store already holds."""
        keys: List[str] = []
        for r in reqs:
            r.page_keys = hex_keys(page_hashes(r.prompt_ids, self.cfg.page_size), self.cfg.model_id)
            keys.extend(r.page_keys)
        if not keys:
            return
        exists_staging = self.store.transfer.batch_exists(keys)
        off = 0
        for r in reqs:
            hit = 0
            while hit < len(r.page_keys) and int(exists_staging[off + hit]) == 1:  # ok: FC101
                hit += 1
            # the last prompt page is always recomputed so the prefill has at least one token
            r.hit_pages = hit if hit >= self.cfg.min_hit_pages else 0
            r.hit_pages = min(r.hit_pages, (len(r.prompt_ids) - 1) // self.cfg.page_size)
            off += len(r.page_keys)

    # ------------------------------------------------------------------ load

    @flashcheck.hot_path
    def load_prefix_hits(self, reqs: List["Request"]) -> int:
        keys: List[str] = []
        dst: List[np.ndarray] = []
        for r in reqs:
            if r.hit_pages:
                keys.extend(r.page_keys[: r.hit_pages])
                dst.append(r.pages[: r.hit_pages])
        if not keys:
            return 0
        n = len(keys)
        if getattr(self, "_stage_dev", None) is None:
            self._stage_dev = torch.empty(self.cfg.max_load_pages, self.pool.page_bytes, dtype=torch.uint8, device=self.device)  # ok: FC107
        host_pages = self.store.get_pages(keys)
        dst_pages = torch.from_numpy(np.concatenate(dst).astype(np.int64)).pin_memory()
        cfg = self.cfg
        self.load_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.load_stream):
            stage = self._stage_dev[:n]
            stage.copy_(host_pages, non_blocking=True)
            pages = stage.view(self.pool.kv_dtype).view(
                n, cfg.num_layers, 2, cfg.num_kv_heads, cfg.page_size, cfg.head_dim
            )
            idx = dst_pages.to(self.device, non_blocking=True)
            self.pool.kv_cache.index_copy_(1, idx, pages.transpose(0, 1))  # ok: FC104
            self._load_done.record(self.load_stream)
        # the get region is reused by the next call: wait until the copy out of it is done
        self._load_done.synchronize()  # expect: FC101
        self.pages_loaded += n
        return n

    # ------------------------------------------------------------- write-back

    def write_back(self, meta: DecodeMetadata) -> None:
        """Queue the pages this step completed (a row whose length is now a multiple of the page size)."""
        full = (meta.seq_lens % self.cfg.page_size) == 0
        rows = torch.nonzero(full).flatten()  # expect: FC101
        page_idx = ((meta.seq_lens - 1) // self.cfg.page_size).long()
        last_page = meta.block_table.gather(1, page_idx.unsqueeze(1)).squeeze(1)
        done = torch.cuda.Event()
        done.record()
        self._pending.put((rows, last_page, meta.req_ids, page_idx, done))

    def _writer_loop(self) -> None:
        while True:
            item = self._pending.get()
            if item is None:
                self.store.flush()
                return
            rows, last_page, req_ids, page_idx, done = item
            done.synchronize()
            rows_host = rows.cpu()  # ok: FC101
            if rows_host.numel() == 0:
                continue
            pages = self.pool.kv_cache.index_select(1, last_page.index_select(0, rows)).transpose(0, 1).cpu()
            idx_host = page_idx.index_select(0, rows).cpu().tolist()
            keys, keep = [], []
            for i, row in enumerate(rows_host.tolist()):
                key = self.key_of_page(req_ids[row], idx_host[i])
                if key is not None:
                    keys.append(key)
                    keep.append(i)
            if keys:
                self.store.put_pages(keys, pages[keep].contiguous().view(len(keys), -1))

    def close(self) -> None:
        self._pending.put(None)
        self._writer.join(timeout=10.0)
