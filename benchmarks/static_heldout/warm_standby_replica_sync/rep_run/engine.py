"""The primary engine, the warm standby, and the failover that promotes the standby."""

import math
import queue
from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import torch
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from rep_attn.backend import PrefillMeta, ReplicaBackend, StepMeta
from rep_attn.workspace import trtllm_workspace
from rep_run.graphs import ReplicaGraphs
from rep_run.model import ReplicaModel
from standby import PagePool, ReplicaConfig, page_offsets
from standby.sync import ReplicaSyncManager


@dataclass
class HostBatch:
    num_rows: int
    input_ids: np.ndarray
    seq_lens: np.ndarray
    page_tables: List[np.ndarray]
    new_pages: np.ndarray
    slots: np.ndarray


class Replica:
    """Pool, backend, model and graphs of one device."""

    def __init__(self, cfg: ReplicaConfig, device: torch.device, role: str):
        self.cfg = cfg
        self.device = device
        self.pool = PagePool(cfg, device)
        self.backend = ReplicaBackend(cfg, device, role)
        self.backend.init_graph_wrappers()
        self.model = ReplicaModel(cfg, self.backend).to(device)
        self.graphs = ReplicaGraphs(self.model, self.backend, self.pool, cfg)


class PrimaryEngine:
    def __init__(self, replica: Replica, sync: Optional[ReplicaSyncManager]):
        cfg = replica.cfg
        self.cfg = cfg
        self.replica = replica
        self.device = replica.device
        self.pool = replica.pool
        self.backend = replica.backend
        self.graphs = replica.graphs
        self.sync = sync
        self.indptr_pinned = torch.zeros(cfg.max_batch + 1, dtype=torch.int32, pin_memory=True)
        self.last_pinned = torch.ones(cfg.max_batch, dtype=torch.int32, pin_memory=True)
        self.tokens_pinned = torch.zeros(cfg.max_batch, dtype=torch.int64, pin_memory=True)
        self.out_q: "queue.Queue" = queue.Queue()
        self.step_idx = 0

    def meta_from_host(self, batch: HostBatch) -> StepMeta:
        n = batch.num_rows
        ind = self.indptr_pinned.numpy()
        ind[0] = 0
        np.cumsum([len(t) for t in batch.page_tables], out=ind[1 : n + 1])
        self.last_pinned.numpy()[:n] = (batch.seq_lens - 1) % self.cfg.page_size + 1
        indptr_host = self.indptr_pinned[: n + 1]
        flat = np.concatenate(batch.page_tables).astype(np.int32)
        return StepMeta(
            num_rows=n,
            input_ids=torch.from_numpy(batch.input_ids).to(self.device, non_blocking=True),
            seq_lens=torch.from_numpy(batch.seq_lens).to(self.device, non_blocking=True),
            kv_indptr=indptr_host.to(self.device, non_blocking=True),
            kv_indptr_host=indptr_host,
            kv_indices=torch.from_numpy(flat).to(self.device, non_blocking=True),
            last_page_len_host=self.last_pinned[:n],
        )

    def admit(self, meta: PrefillMeta, input_ids, positions, slots, last_rows) -> torch.Tensor:
        self.backend.plan_prefill(meta)
        return replica_prefill(self.replica, input_ids, positions, slots, last_rows)

    def step(self, batch: HostBatch) -> None:
        self.pool.mark_dirty(batch.new_pages)
        meta = self.meta_from_host(batch)
        bs = self.graphs.bucket_for(batch.num_rows)
        if bs in self.backend.graph_wrappers:
            self.backend.prepare_bucket(bs, meta)
        else:
            self.backend.plan_eager(meta)
        if self.sync is not None:
            # the mirror copy may still read pages this step appends to
            torch.cuda.current_stream().wait_event(self.sync.copy_done)  # ok: FC101
        slots = torch.from_numpy(batch.slots).to(self.device, non_blocking=True)
        logits = self.graphs.run_bucket(bs, meta, slots)
        tokens = torch.argmax(logits, dim=-1)
        self.tokens_pinned[: batch.num_rows].copy_(tokens, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        self.out_q.put((done, batch.num_rows))
        if self.sync is not None:
            self.sync.maybe_sync(self.step_idx)
        self.step_idx += 1

    def report(self) -> dict:
        return {"step": self.step_idx, "replays": self.graphs.replay_report()}


def replica_prefill(replica: Replica, input_ids, positions, slots, last_rows) -> torch.Tensor:
    return replica.model.forward_prefill(input_ids, positions, replica.pool.kv_cache, slots, last_rows)


class StandbyEngine:
    def __init__(self, replica: Replica):
        self.replica = replica
        self.cfg = replica.cfg
        self.device = replica.device
        self.pool = replica.pool
        self.backend = replica.backend
        self.graphs = replica.graphs

    def start(self) -> None:
        self.graphs.record_buckets()

    def catch_up(self, qo_indptr_host: torch.Tensor, kv_indices: torch.Tensor, last_page_len_host: torch.Tensor,
                 input_ids: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """Recomputes the tokens the primary decoded since the last mirror."""
        n = qo_indptr_host.numel() - 1
        self.backend.prefill.plan(  # expect: FC102
            qo_indptr=qo_indptr_host,
            paged_kv_indptr=self.pool.page_indptr_gpu[: n + 1],
            paged_kv_indices=kv_indices,
            paged_kv_last_page_len=last_page_len_host,
            num_qo_heads=self.cfg.num_qo_heads,
            num_kv_heads=self.cfg.num_kv_heads,
            head_dim_qk=self.cfg.head_dim,
            page_size=self.cfg.page_size,
            causal=True,
        )
        starts = page_offsets(self.pool.page_indptr_gpu[: n + 1], self.cfg.page_size)
        positions = torch.arange(input_ids.numel(), device=self.device) + starts[0]
        last_rows = (qo_indptr_host[1:] - 1).to(self.device, non_blocking=True)
        return replica_prefill(self.replica, input_ids, positions, slots, last_rows)

    def catch_up_decode(self, layer_id: int, q: torch.Tensor, block_tables: torch.Tensor,
                        seq_lens: torch.Tensor, max_seq_len: int) -> torch.Tensor:
        ws = trtllm_workspace(self.cfg, self.device)
        scale = 1.0 / math.sqrt(self.cfg.head_dim)
        return trtllm_batch_decode_with_kv_cache(
            q, self.pool.kv_cache[layer_id], ws, block_tables, seq_lens, max_seq_len, scale, 1.0
        )


class Failover:
    def __init__(self, primary: PrimaryEngine, standby: StandbyEngine, sync: ReplicaSyncManager):
        self.primary = primary
        self.standby = standby
        self.sync = sync

    def promote(self) -> PrimaryEngine:
        self.sync.copy_done.synchronize()
        for bs, w in self.standby.backend.graph_wrappers.items():
            if not w._use_cuda_graph:  # expect: FC103
                raise RuntimeError(f"standby bucket {bs} lost graph mode")
        self.standby.graphs.rebind_to(self.standby.pool)
        return PrimaryEngine(self.standby.replica, sync=None)


def build_pair(cfg: ReplicaConfig):
    primary = Replica(cfg, cfg.primary_device, "primary")
    standby = Replica(cfg, cfg.standby_device, "standby")
    sync = ReplicaSyncManager(
        primary.pool, standby.pool, primary.backend, standby.backend, cfg.sync_every, cfg.full_sync_every
    )
    engine = PrimaryEngine(primary, sync)
    warm = StandbyEngine(standby)
    primary.graphs.record_buckets()
    warm.start()
    return engine, warm, Failover(engine, warm, sync)
