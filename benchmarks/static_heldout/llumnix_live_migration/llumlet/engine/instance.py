"""One llumlet: serves its running batch every step and takes part in live migrations."""
from __future__ import annotations

import queue
import threading
from dataclasses import dataclass

import numpy as np
import torch

from llumlet.attn.backend import DecodeBatch, InstanceAttnBackend
from llumlet.config import InstanceConfig
from llumlet.engine.graph_runner import DecodeGraphRunner
from llumlet.engine.model import DecoderModel
from llumlet.kv.block_table import BlockTable
from llumlet.migration.receiver import IncomingMigration, MigrationReceiver
from llumlet.migration.scheduler import InstanceLoad
from llumlet.migration.sender import MigrationSender


@dataclass
class Request:
    rid: int
    seq_len: int
    priority: int = 0


class LlumletInstance:
    def __init__(self, cfg: InstanceConfig, rank: int, group, device: torch.device):
        self.cfg = cfg
        self.rank = rank
        self.device = device
        self._backend = "flashinfer"
        self.block_table = BlockTable(cfg.num_blocks, cfg.block_size)
        self.backend = InstanceAttnBackend(cfg, device)
        self.backend.init_graph_buffers()
        self.kv_caches = [
            torch.zeros(
                cfg.num_blocks, 2, cfg.block_size, cfg.num_kv_heads, cfg.head_dim, dtype=torch.bfloat16, device=device
            )
            for _ in range(cfg.num_layers)
        ]
        self.model = DecoderModel(cfg, self.backend).to(device)
        self.graph_runner = DecodeGraphRunner(cfg, self.model, self.backend, self.kv_caches, device)
        self.sender = MigrationSender(cfg, self.block_table, self.kv_caches, group, device)
        self.receiver = MigrationReceiver(cfg, self.backend, self.block_table, self.kv_caches, group, device)
        self.running: list = []
        self.migrate_out: list = []  # (rid, dst_rank) decided by the global scheduler
        self.next_tokens = torch.zeros(cfg.max_num_seqs, dtype=torch.int64, device=device)
        self._pinned_out = torch.empty(cfg.max_num_seqs, dtype=torch.int64, pin_memory=True)
        self.outputs: "queue.Queue[tuple]" = queue.Queue()
        self.results: dict[int, list] = {}
        self.load = InstanceLoad(cfg.instance_id, rank, 0, cfg.num_blocks, 0)
        self._out_thread = threading.Thread(target=self._output_loop, daemon=True)
        self._out_thread.start()

    def describe(self) -> str:
        return f"llumlet {self.cfg.instance_id} on {self._backend}"  # ok: FC103

    # ------------------------------------------------------------------ migration control plane
    def accept_migration(self, mig_id: int, rid: int, src_rank: int, num_blocks: int, seq_len: int, splice_offset: int):
        blocks = self.block_table.reserve(mig_id, num_blocks)
        mig = IncomingMigration(
            mig_id=mig_id,
            rid=rid,
            src_rank=src_rank,
            dst_blocks=blocks,
            dst_blocks_gpu=torch.tensor(blocks, dtype=torch.int64).to(self.device),
            seq_len_cpu=torch.tensor([seq_len], dtype=torch.int64).pin_memory(),
            splice_offset=splice_offset,
            final=True,
        )
        self.receiver.post(mig, num_blocks)

    def _admit_resumed(self, rid: int) -> None:
        self.running.append(Request(rid, self.receiver.resumed_lens.pop(rid)))

    def drain_request(self, rid: int) -> None:
        """Last migration stage: stop decoding the request here and send what is left."""
        row = next(i for i, r in enumerate(self.running) if r.rid == rid)
        n = len(self.running)
        # keep the decode rows dense for the next step: shift the rows after it up by one
        lens = self.backend.kv_last_page_len
        lens[row : n - 1] = lens[row + 1 : n].clone()  # expect: FC104
        self.next_tokens[row : n - 1] = self.next_tokens[row + 1 : n].clone()
        self.running.pop(row)
        self.sender.send_rest(rid)
        self.block_table.free_request(rid)

    # ------------------------------------------------------------------ per step
    def _build_batch(self) -> DecodeBatch:
        bsz = self.cfg.block_size
        rids = [r.rid for r in self.running]
        n = len(rids)
        slots = [self.block_table.append_slot(r.rid, r.seq_len) for r in self.running]
        seq_np = np.array([r.seq_len for r in self.running], dtype=np.int32)
        pages = (seq_np + bsz - 1) // bsz
        indptr_np = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(pages, out=indptr_np[1:])
        indices_np = np.concatenate([self.block_table.tables[rid][:k] for rid, k in zip(rids, pages)]).astype(np.int32)
        last_np = ((seq_np - 1) % bsz + 1).astype(np.int32)
        seq_cpu = torch.from_numpy(seq_np).pin_memory()
        last_cpu = torch.from_numpy(last_np).pin_memory()
        seq_gpu = seq_cpu.to(self.device, non_blocking=True)
        return DecodeBatch(
            rids=rids,
            input_ids=self.next_tokens[:n].clone(),
            positions=seq_gpu - 1,
            seq_lens=seq_gpu,
            seq_lens_cpu=seq_cpu,
            slot_mapping=torch.tensor(slots, dtype=torch.int64).to(self.device, non_blocking=True),
            kv_indptr_cpu=torch.from_numpy(indptr_np).pin_memory(),
            kv_indices=torch.from_numpy(indices_np).to(self.device, non_blocking=True),
            kv_last_page_len_cpu=last_cpu,
            kv_last_page_len_gpu=last_cpu.to(self.device, non_blocking=True),
        )

    def step(self) -> None:
        for rid in self.receiver.poll():
            self._admit_resumed(rid)
        for rid, dst_rank in self.migrate_out:
            self.sender.start(rid, dst_rank)
        self.migrate_out.clear()
        if not self.running:
            return
        batch = self._build_batch()
        n = len(batch.rids)
        bs = self.graph_runner.bucket_for(n)
        if bs is None:
            meta = self.backend.plan_decode(batch)
            logits = self.model(batch.input_ids, self.kv_caches, meta)
        else:
            logits = self.graph_runner.replay(bs, batch)
        torch.argmax(logits, dim=-1, out=self.next_tokens[:n])
        self._pinned_out[:n].copy_(self.next_tokens[:n], non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        self.outputs.put((done, list(batch.rids), n))
        for r in self.running:
            r.seq_len += 1
        for rid in self.sender.on_step_end(batch):
            self.drain_request(rid)
        self.load.used_blocks = int(np.count_nonzero(self.block_table.used_mask))  # ok: FC101
        self.load.num_running = len(self.running)
        self.load.candidates = [(r.rid, r.seq_len) for r in self.running if r.priority == 0]

    def _output_loop(self) -> None:
        while True:
            done, rids, n = self.outputs.get()
            done.synchronize()
            for rid, tok in zip(rids, self._pinned_out[:n].tolist()):
                self.results.setdefault(rid, []).append(tok)
