"""One GPU of the node: its pool, page table, attention, model and graphs, and its decode step."""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Optional

import numpy as np
import torch

from gpumig.limits import MigrationLimits
from gpumig.page_table import DevicePageTable, KVPool, PageAllocator
from gpumig.topology import NodeTopology
from migrt.attention import DeviceAttention
from migrt.batch import StepBatch, build_step_batch
from migrt.graphs import DeviceGraphs
from migrt.model import ShardLM

if TYPE_CHECKING:
    from migrt.migrator import Migration


class MigrationWorker:
    def __init__(self, rank: int, limits: MigrationLimits, topo: NodeTopology) -> None:
        self.rank = rank
        self.limits = limits
        self.page_size = limits.page_size
        self.device = topo.devices[rank]
        self.incoming = topo.link(1 - rank, rank)
        self.pool = KVPool(limits, self.device)
        self.alloc = PageAllocator(limits.num_pages)
        self.table = DevicePageTable(limits, self.device)
        self.attn = DeviceAttention(limits, self.pool, self.table, self.device)
        self.model = ShardLM(limits, self.attn, self.pool).to(self.device, torch.bfloat16)
        self.graphs = DeviceGraphs(limits, self.model, self.attn, self.device)
        self.last_ids = torch.zeros(limits.max_batch, dtype=torch.int64, device=self.device)
        self.tokens: Dict[int, List[int]] = {}  # appended by the detokenizer thread
        self.migrating_in: Dict[int, "Migration"] = {}
        self.len_pinned = torch.zeros(limits.max_batch, dtype=torch.int32, pin_memory=True)
        self.load_report: Dict[int, int] = {}
        self.report_lengths = False
        self.peer_dirty = True
        self.last_offsets: Dict[int, int] = {}

    # ------------------------------------------------------------------ requests

    def prefill(self, rid: int, tokens: List[int]) -> None:
        """New requests, and migrated ones whose KV could not be copied (no peer access): recompute."""
        n = len(tokens)
        ps = self.page_size
        pages = self.alloc.take((n + ps - 1) // ps)
        row = self.table.add(rid, pages, n)
        self.tokens[rid] = list(tokens)
        loc = np.array([pages[i // ps] * ps + i % ps for i in range(n)], dtype=np.int64)
        self.attn.plan_recompute(np.array([0, n], dtype=np.int32))
        logits = self.model.prefill(
            torch.tensor(tokens, dtype=torch.int64).to(self.device, non_blocking=True),
            torch.arange(n, device=self.device),
            torch.from_numpy(loc).to(self.device, non_blocking=True),
        )
        self.last_ids[row : row + 1].copy_(torch.argmax(logits, dim=-1))

    def adopt(self, rid: int, length: int, last_token: torch.Tensor, mig: "Migration") -> None:
        """A request migrating in: no local pages yet; it decodes here from the next step on."""
        row = self.table.add(rid, [], length)
        self.last_ids[row : row + 1].copy_(last_token, non_blocking=True)
        self.migrating_in[rid] = mig
        self.peer_dirty = True

    def release(self, rid: int) -> List[int]:
        pages = self.table.remove(rid)
        self.alloc.give_back(pages)
        self.tokens.pop(rid, None)
        return pages

    def _grow(self, rid: int) -> None:
        n = self.table.lens[rid]
        if n % self.page_size == 0:
            self.table.set_pages(rid, self.table.pages[rid] + self.alloc.take(1))
        self.table.lens[rid] = n + 1

    # ------------------------------------------------------------------ peer pages

    def _plan_peer(self, batch: StepBatch, bs: int) -> None:
        """Rows migrating in attend the pages still on the source over the peer link."""
        if self.attn.peer_kv is None:
            return
        if not self.peer_dirty and self.attn.peer_decode.__dict__.get("_plan_info") is not None:  # expect: FC103
            return
        remaining = [self.migrating_in[r].remaining_src() if r in self.migrating_in else [] for r in batch.rids]
        counts = np.zeros(bs, dtype=np.int32)
        counts[: batch.size] = [len(p) for p in remaining]
        indptr = np.zeros(bs + 1, dtype=np.int32)
        np.cumsum(counts, out=indptr[1:])
        flat = np.array([p for pages in remaining for p in pages], dtype=np.int32)
        hq, hkv, d, ps = self.limits.num_qo_heads, self.limits.num_kv_heads, self.limits.head_dim, self.page_size
        args = (
            torch.from_numpy(indptr).to(self.device, non_blocking=True),
            torch.from_numpy(flat).to(self.device, non_blocking=True),
            torch.from_numpy(np.full(bs, ps, dtype=np.int32)),
            hq,
            hkv,
            d,
            ps,
        )
        self.attn.peer_decode.plan(*args)  # expect: FC102
        self.peer_dirty = False

    # ------------------------------------------------------------------ step

    def step(self) -> Optional[torch.Tensor]:
        rids = list(self.table.rows)
        if not rids:
            return None
        for rid in rids:
            self._grow(rid)
        batch = build_step_batch(rids, self.table, self.last_ids, self.device)
        self.last_offsets = batch.offsets
        # KV that landed on the copy stream must be visible to this step's kernels
        torch.cuda.current_stream(self.device).wait_stream(self.incoming.stream)  # ok: FC101
        graphed = batch.size <= self.limits.max_graph_bs
        bs = self.graphs.bucket_for(batch.size) if graphed else batch.size
        self._plan_peer(batch, bs)
        if graphed:
            logits = self.graphs.run_bucket(batch, bs)
        else:
            self.attn.prepare_eager(batch, batch.rows)
            logits = self.model.decode(batch.input_ids, batch.positions, batch.out_loc, batch.size)
        next_ids = torch.argmax(logits, dim=-1)
        self.last_ids.index_copy_(0, batch.rows, next_ids)
        if self.report_lengths:
            n = batch.size
            self.len_pinned[:n].copy_(batch.seq_lens_dev, non_blocking=True)
            lens = self.len_pinned[:n].tolist()  # expect: FC101
            self.load_report.update(zip(batch.rids, lens))
        return next_ids
