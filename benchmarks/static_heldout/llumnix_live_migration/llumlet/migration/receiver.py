"""Destination side: blocks arrive into reserved blocks; a finished migration resumes the request."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist

from llumlet.attn.backend import InstanceAttnBackend
from llumlet.config import InstanceConfig
from llumlet.kv.block_table import BlockTable


@dataclass
class IncomingMigration:
    mig_id: int
    rid: int
    src_rank: int
    dst_blocks: list
    dst_blocks_gpu: torch.Tensor
    seq_len_cpu: torch.Tensor  # pinned, one element
    splice_offset: int
    final: bool = False
    works: Optional[list] = None

    def done(self) -> bool:
        return self.works is not None and all(w.is_completed() for w in self.works)


class MigrationReceiver:
    def __init__(
        self,
        cfg: InstanceConfig,
        backend: InstanceAttnBackend,
        block_table: BlockTable,
        kv_caches: list,
        group,
        device: torch.device,
    ):
        self.cfg = cfg
        self.backend = backend
        self.block_table = block_table
        self.kv_caches = kv_caches
        self.group = group
        self.device = device
        self.comm_stream = torch.cuda.Stream()
        self.pending: dict[int, IncomingMigration] = {}
        self.resumed_lens: dict[int, int] = {}
        self._recv_stage: Optional[torch.Tensor] = None

    def _ensure_stage(self) -> torch.Tensor:
        if self._recv_stage is None:
            cfg = self.cfg
            self._recv_stage = torch.empty(  # ok: FC107
                cfg.num_layers, cfg.migration_stage_blocks, 2, cfg.block_size, cfg.num_kv_heads, cfg.head_dim,
                dtype=torch.bfloat16, device=self.device,
            )
        return self._recv_stage

    def post(self, mig: IncomingMigration, n: int) -> None:
        stage = self._ensure_stage()
        with torch.cuda.stream(self.comm_stream):
            mig.works = [
                dist.irecv(stage[layer, :n], mig.src_rank, group=self.group, tag=layer)
                for layer in range(len(self.kv_caches))
            ]
        self.pending[mig.mig_id] = mig

    def _scatter(self, mig: IncomingMigration) -> None:
        arrived = torch.cuda.Event()
        arrived.record(self.comm_stream)
        torch.cuda.current_stream().wait_event(arrived)  # ok: FC101
        stage = self._ensure_stage()
        n = len(mig.dst_blocks)
        for layer, kv in enumerate(self.kv_caches):
            kv.index_copy_(0, mig.dst_blocks_gpu, stage[layer, :n])

    def _resume(self, mig: IncomingMigration) -> int:
        # splice the request's blocks into the decode graphs' page list so it can join this step's replay
        start = mig.splice_offset
        n = len(mig.dst_blocks)
        self.backend.kv_indices[start : start + n].copy_(mig.dst_blocks_gpu.to(torch.int32))  # expect: FC104
        self.block_table.commit_reserved(mig.mig_id, mig.rid)
        self.resumed_lens[mig.rid] = mig.seq_len_cpu.item()  # ok: FC101
        return mig.rid

    def poll(self) -> list:
        resumed = []
        for mig_id, mig in list(self.pending.items()):
            if not mig.done():
                continue
            self._scatter(mig)
            del self.pending[mig_id]
            if mig.final:
                resumed.append(self._resume(mig))
        return resumed
