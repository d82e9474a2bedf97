from dataclasses import dataclass, field
from typing import List

import numpy as np
import torch

from reorder.kv_pages import PageTable
from reorder.limits import ReorderLimits
from reorder.permutation import PermutationState, invert, longest_first_permutation
from reorder_srv.backend import PermutedDecodeBackend
from reorder_srv.graph_pool import PermutedGraphPool
from reorder_srv.meta import DecodeMeta
from reorder_srv.model import PermutedModel
from reorder_srv.unpermute import OutputUnpermuter


@dataclass
class Seq:
    rid: str
    row: int
    last_token: int
    position: int
    output_ids: List[int] = field(default_factory=list)


class ReorderEngine:
    def __init__(self, limits: ReorderLimits, device="cuda"):
        lim = limits
        self.limits = lim
        self.device = torch.device(device)
        kv_cache = torch.zeros(
            (lim.num_layers, lim.max_pages, 2, lim.page_size, lim.num_kv_heads, lim.head_dim),
            dtype=torch.bfloat16,
            device=self.device,
        )
        self.pages = PageTable(lim.max_batch, lim.max_seq_len // lim.page_size, lim.max_pages)
        self.backend = PermutedDecodeBackend(lim, kv_cache, self.device)
        self.model = PermutedModel(lim, self.backend).to(self.device)
        self.graph_pool = PermutedGraphPool(self.model, self.backend, lim)
        self.unpermuter = OutputUnpermuter(self.backend, lim.max_batch, self.device)
        self.perm_state = PermutationState(lim.max_batch)
        self.running: List[Seq] = []
        self._plan_info = {}  # ok: FC103
        self.order_host = None
        self.stats = {"reorders": 0, "heavy_steps": 0}

    def start(self):
        self.graph_pool.record_all()

    def step(self):
        lim = self.limits
        seqs = self.running[: lim.max_batch]
        bs = len(seqs)
        if bs == 0:
            return []
        bucket = lim.bucket_for(bs)
        if bucket == 0:
            return self._overflow_step(seqs)
        # the KV lengths advance inside the captured graph, so the device copy is the current one
        kv_lens = self.backend.kv_lens_dev[:bs].tolist()  # expect: FC101
        perm_np = longest_first_permutation(kv_lens, bucket)
        inv_np = invert(perm_np)
        self.perm_state.stage(perm_np, inv_np)
        if not self.perm_state.unchanged():
            self.stats["reorders"] += 1
        self.order_host = torch.tensor(perm_np, dtype=torch.int64, device="cpu")  # ok: FC107
        self.backend.perm_dev[:bucket].copy_(self.perm_state.perm_cpu[:bucket], non_blocking=True)  # ok: FC104

        rows_np = np.array([s.row for s in seqs], dtype=np.int64)
        indptr_np, indices_np, pages_np = self.pages.flat(rows_np)
        lens_np = np.array([s.position + 1 for s in seqs], dtype=np.int64)
        last_np = ((lens_np - 1) % lim.page_size + 1).astype(np.int32)
        sorted_rows = perm_np[:bs]
        sorted_pages_np = np.zeros(bucket, dtype=np.int32)
        sorted_pages_np[:bs] = pages_np[sorted_rows]
        sorted_indptr_np = np.zeros(bucket + 1, dtype=np.int32)
        np.cumsum(sorted_pages_np, out=sorted_indptr_np[1:])
        sorted_last_np = np.ones(bucket, dtype=np.int32)
        sorted_last_np[:bs] = last_np[sorted_rows]
        n_heavy_host = int(np.count_nonzero(sorted_pages_np[: lim.heavy_rows] >= lim.heavy_min_pages))  # ok: FC101
        if n_heavy_host:
            self.stats["heavy_steps"] += 1
        meta = DecodeMeta(
            bs=bs,
            bucket=bucket,
            kv_indptr_cpu=torch.from_numpy(indptr_np),
            last_page_cpu=torch.from_numpy(last_np),
            kv_indices_np=indices_np,
            sorted_pages_np=sorted_pages_np,
            sorted_indptr_np=sorted_indptr_np,
            sorted_last_np=sorted_last_np,
        )
        self._plan_info[bucket] = (bs, n_heavy_host)
        ids_dev = torch.tensor([s.last_token for s in seqs], dtype=torch.int64).to(self.device, non_blocking=True)
        pos_dev = torch.tensor([s.position for s in seqs], dtype=torch.int64).to(self.device, non_blocking=True)
        sorted_logits = self.graph_pool.replay_bucket(meta, ids_dev, pos_dev)
        logits = self.unpermuter.unpermute(sorted_logits, bs)
        next_ids = torch.argmax(logits, dim=-1)
        self.backend.kv_lens_dev[:bs] += 1
        return next_ids

    def _overflow_step(self, seqs):
        lim = self.limits
        rows_np = np.array([s.row for s in seqs], dtype=np.int64)
        indptr_np, indices_np, _ = self.pages.flat(rows_np)
        lens_np = np.array([s.position + 1 for s in seqs], dtype=np.int64)
        last_np = ((lens_np - 1) % lim.page_size + 1).astype(np.int32)
        long_tail = bool(lens_np.max() > lim.long_tail_pages * lim.page_size)
        if not long_tail:
            self.backend.plan_overflow(indptr_np, indices_np, last_np)
        meta = DecodeMeta(
            bs=len(seqs),
            bucket=0,
            kv_indptr_cpu=torch.from_numpy(indptr_np),
            last_page_cpu=torch.from_numpy(last_np),
            kv_indices_np=indices_np,
            sorted_pages_np=np.zeros(0, dtype=np.int32),
            sorted_indptr_np=indptr_np,
            sorted_last_np=last_np,
            long_tail=long_tail,
            block_tables=torch.from_numpy(self.pages.rows[rows_np]).to(self.device, non_blocking=True),
            seq_lens_dev=torch.from_numpy(lens_np.astype(np.int32)).to(self.device, non_blocking=True),
        )
        ids_dev = torch.tensor([s.last_token for s in seqs], dtype=torch.int64).to(self.device, non_blocking=True)
        pos_dev = torch.tensor([s.position for s in seqs], dtype=torch.int64).to(self.device, non_blocking=True)
        return torch.argmax(self.model(ids_dev, pos_dev, meta), dim=-1)

    def prefill(self, prompts):
        """Prompts are prefilled eagerly in arrival order; only decode is reordered."""
        lens_np = np.array([len(p) for p in prompts], dtype=np.int32)
        qo_indptr_np = np.zeros(len(prompts) + 1, dtype=np.int32)
        np.cumsum(lens_np, out=qo_indptr_np[1:])
        self.backend.plan_prefill(qo_indptr_np)
        ids_dev = torch.tensor([t for p in prompts for t in p], dtype=torch.int64).to(self.device, non_blocking=True)
        pos_np = np.concatenate([np.arange(n, dtype=np.int64) for n in lens_np])
        pos_dev = torch.from_numpy(pos_np).to(self.device, non_blocking=True)
        logits = self.model(ids_dev, pos_dev)
        return torch.argmax(logits[torch.from_numpy(qo_indptr_np[1:] - 1).to(self.device)], dim=-1)
