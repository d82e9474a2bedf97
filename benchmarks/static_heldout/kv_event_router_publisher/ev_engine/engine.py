"""Engine that publishes a KV event batch (blocks stored / removed) to the router after every step."""

from dataclasses import dataclass, field
from typing import Dict, List, Optional

import flashcheck
import numpy as np
import torch

from kvevents import BlockHasher, EventPublisher
from ev_engine.backend import EventAwareBackend
from ev_engine.batch import EventBatch
from ev_engine.block_manager import BlockManager
from ev_engine.config import EventEngineConfig
from ev_engine.graph_runner import EventGraphRunner
from ev_engine.model import EventLM


@dataclass
class Seq:
    req_id: int
    tokens: List[int]
    num_computed: int = 0
    blocks: List[int] = field(default_factory=list)


class EventEngine:
    def __init__(self, cfg: EventEngineConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.hasher = BlockHasher(cfg.page_size)
        self.publisher = EventPublisher(cfg.router_endpoint)
        self.publisher.start()
        self.backend = EventAwareBackend(cfg, device)
        self.blocks = BlockManager(cfg.num_blocks, cfg.page_size, device, self.hasher)
        self.model = EventLM(cfg, self.backend, device)
        self.runner = EventGraphRunner(self.model, self.backend, cfg, device)
        self.seqs: Dict[int, Seq] = {}
        self.waiting: List[int] = []
        self.running: List[int] = []
        nb = cfg.max_batch + 1
        self.qo_pinned = torch.zeros(nb, dtype=torch.int32, pin_memory=True)
        self.kv_pinned = torch.zeros(nb, dtype=torch.int32, pin_memory=True)
        self.last_pinned = torch.zeros(cfg.max_batch, dtype=torch.int32, pin_memory=True)
        self.indices_pinned = torch.zeros(cfg.num_blocks, dtype=torch.int32, pin_memory=True)
        self.slots_pinned = torch.zeros(cfg.max_num_tokens, dtype=torch.int64, pin_memory=True)

    def add_request(self, req_id: int, prompt: List[int]) -> None:
        self.seqs[req_id] = Seq(req_id=req_id, tokens=list(prompt))
        self.waiting.append(req_id)

    def _schedule(self) -> Optional[EventBatch]:
        ps = self.cfg.page_size
        if self.waiting:
            rids = self.waiting[:1]
            self.waiting = self.waiting[1:]
            is_prefill = True
        elif self.running:
            rids = self.running[: self.cfg.max_batch]
            is_prefill = False
        else:
            return None
        ids, pos, lens, ext, slots = [], [], [], [], []
        for rid in rids:
            s = self.seqs[rid]
            new = s.tokens[s.num_computed :] if is_prefill else s.tokens[-1:]
            start = len(s.tokens) - len(new)
            need = (len(s.tokens) + ps - 1) // ps - len(s.blocks)
            if need > 0:
                s.blocks.extend(self.blocks.allocate(rid, need))
            ids.extend(new)
            pos.extend(range(start, len(s.tokens)))
            slots.extend(s.blocks[p // ps] * ps + p % ps for p in range(start, len(s.tokens)))
            lens.append(len(s.tokens))
            ext.append(len(new))
            s.num_computed = len(s.tokens)
        bs = len(rids)
        lens_np = np.asarray(lens, dtype=np.int64)
        pages = (lens_np + ps - 1) // ps
        table = np.zeros((bs, int(pages.max())), dtype=np.int32)
        for i, rid in enumerate(rids):
            table[i, : pages[i]] = self.seqs[rid].blocks[: pages[i]]
        qo_np, kv_np = self.qo_pinned.numpy(), self.kv_pinned.numpy()
        qo_np[0] = kv_np[0] = 0
        np.cumsum(ext, out=qo_np[1 : bs + 1])
        np.cumsum(pages, out=kv_np[1 : bs + 1])
        nnz = int(kv_np[bs])
        self.indices_pinned.numpy()[:nnz] = np.concatenate([table[i, : pages[i]] for i in range(bs)])
        self.last_pinned.numpy()[:bs] = lens_np - (pages - 1) * ps
        n_tok = len(ids)
        self.slots_pinned.numpy()[:n_tok] = slots
        kv_cu = np.concatenate([[0], np.cumsum(lens_np)]).astype(np.int32)
        return EventBatch(
            is_prefill=is_prefill,
            batch_size=bs,
            req_ids=list(rids),
            input_ids=torch.as_tensor(ids, dtype=torch.int64).to(self.device, non_blocking=True),
            positions=torch.as_tensor(pos, dtype=torch.int64).to(self.device, non_blocking=True),
            seq_lens=torch.from_numpy(lens_np).to(self.device, non_blocking=True),
            seq_lens_np=lens_np,
            page_table_np=table,
            qo_indptr=self.qo_pinned[: bs + 1].to(self.device, non_blocking=True),
            qo_indptr_cpu=self.qo_pinned[: bs + 1],
            kv_indptr_cpu=self.kv_pinned[: bs + 1],
            kv_indices=self.indices_pinned[:nnz].to(self.device, non_blocking=True),
            kv_last_page_len=self.last_pinned[:bs].to(self.device, non_blocking=True),
            kv_last_page_len_cpu=self.last_pinned[:bs],
            block_tables=torch.from_numpy(table).to(self.device, non_blocking=True),
            kv_cu_seqlens=torch.from_numpy(kv_cu).to(self.device, non_blocking=True),
            slot_mapping_cpu=self.slots_pinned[:n_tok],
            max_q_len=max(ext),
            max_kv_len=int(lens_np.max()),
        )

    @flashcheck.hot_path
    def step(self) -> None:
        fb = self._schedule()
        if fb is None:
            return
        graphed = False
        if fb.is_prefill:
            self.backend.init_forward_metadata(fb)
            logits = self.model.forward_prefill(fb)
        elif self.runner.bucket_for(fb.batch_size) is not None:
            logits = self.runner.replay(fb)
            graphed = True
        else:
            self.backend.init_forward_metadata(fb)
            logits = self.model.forward_decode_eager(fb.input_ids)
        next_ids = self.runner.sample(logits, fb.batch_size).tolist()  # expect: FC101
        stored, removed, remaps = self.blocks.commit_step(
            fb.req_ids, [self.seqs[r].tokens for r in fb.req_ids], next_ids
        )
        if graphed and remaps:
            # compaction moved cached blocks: patch the captured page list instead of re-planning
            bufs = self.backend.graph_bufs
            listed = self.backend.indices_np[: self.runner.last_nnz]
            for old, new in remaps:
                for pos in np.flatnonzero(listed == old):
                    bufs["kv_indices"][int(pos)] = new  # expect: FC104
        for rid in fb.req_ids:
            if rid not in self.running:
                self.running.append(rid)
        self.publisher.publish(stored + removed)
