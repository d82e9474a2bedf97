"""Source side of a live migration: blocks committed so far are sent in stages while the request keeps
decoding here; once what is left fits in one small stage the instance drains the request and sends
the rest."""
from __future__ import annotations

import logging

import torch
import torch.distributed as dist

from llumlet.attn.backend import DecodeBatch
from llumlet.config import InstanceConfig
from llumlet.kv.block_table import BlockTable

logger = logging.getLogger(__name__)


class MigrationStage:
    """One request's outgoing migration; created when the scheduler picks the request."""

    def __init__(self, rid: int, dst_rank: int, cfg: InstanceConfig, device: torch.device):
        self.rid = rid
        self.dst_rank = dst_rank
        self.sent_blocks = 0
        self.works: list = []
        self.staging = torch.empty(  # ok: FC107
            cfg.num_layers, cfg.migration_stage_blocks, 2, cfg.block_size, cfg.num_kv_heads, cfg.head_dim,
            dtype=torch.bfloat16, device=device,
        )


class MigrationSender:
    def __init__(self, cfg: InstanceConfig, block_table: BlockTable, kv_caches: list, group, device: torch.device):
        self.cfg = cfg
        self.block_table = block_table
        self.kv_caches = kv_caches
        self.group = group
        self.device = device
        self.stages: dict[int, MigrationStage] = {}

    def start(self, rid: int, dst_rank: int) -> None:
        self.stages[rid] = MigrationStage(rid, dst_rank, self.cfg, self.device)
        logger.info("migrating request %d to rank %d", rid, dst_rank)

    def finish(self, rid: int) -> MigrationStage:
        assert self.stages, "finish() without a migration in flight"  # ok: FC109
        stage = self.stages.pop(rid)
        for w in stage.works:
            w.wait()
        return stage

    def _send_blocks(self, stage: MigrationStage, blocks: list) -> None:
        idx = torch.tensor(blocks, dtype=torch.int64).to(self.device, non_blocking=True)
        n = len(blocks)
        for layer, kv in enumerate(self.kv_caches):
            stage.staging[layer, :n].copy_(kv.index_select(0, idx))
        gathered = torch.cuda.Event()
        gathered.record()
        gathered.synchronize()  # expect: FC101
        for layer in range(len(self.kv_caches)):
            stage.works.append(dist.isend(stage.staging[layer, :n], stage.dst_rank, group=self.group, tag=layer))

    def on_step_end(self, batch: DecodeBatch) -> list:
        """Runs after every step; returns the requests whose remaining KV fits in one last stage."""
        ready = []
        bsz = self.cfg.block_size
        for row, rid in enumerate(batch.rids):
            stage = self.stages.get(rid)
            if stage is None:
                continue
            seq_len = int(batch.seq_lens[row])  # expect: FC101
            full = seq_len // bsz
            todo = self.block_table.tables[rid][stage.sent_blocks : full]
            for off in range(0, len(todo), self.cfg.migration_stage_blocks):
                self._send_blocks(stage, todo[off : off + self.cfg.migration_stage_blocks])
            stage.sent_blocks = full
            if seq_len - full * bsz <= self.cfg.last_stage_tokens:
                ready.append(rid)
        return ready

    def send_rest(self, rid: int) -> MigrationStage:
        stage = self.stages[rid]
        rest = self.block_table.tables[rid][stage.sent_blocks :]
        for off in range(0, len(rest), self.cfg.migration_stage_blocks):
            self._send_blocks(stage, rest[off : off + self.cfg.migration_stage_blocks])
        return self.finish(rid)
