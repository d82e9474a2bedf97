"""Speculative engine: k draft steps on the draft pool, one verify on the target pool, every step."""

from collections import deque

import numpy as np
import torch

from dualspec.config import SpecConfig
from dualspec.pools.draft_pool import DraftDecodePool
from dualspec.pools.verify_pool import VerifyPool
from dualspec.shared_bufs import SharedPageBuffers
from specrt.acceptance import Acceptor
from specrt.batch import DecodeBatch, SpecRequest
from specrt.models import DraftModel, DualKVCache, TargetModel
from specrt.swapper import PoolSwapper


class SpecScheduler:
    def __init__(self, cfg: SpecConfig):
        self.cfg = cfg
        self.running = deque()
        self.last_emitted = None

    def add(self, req: SpecRequest):
        self.running.append(req)

    def next_batch(self, device):
        if not self.running:
            return None
        reqs = list(self.running)[: self.cfg.max_batch_size]
        ps = self.cfg.page_size
        k = self.cfg.num_draft_tokens
        lens_np = np.array([r.seq_len for r in reqs], dtype=np.int32)
        pages_np = (lens_np + k + ps) // ps
        indptr_np = np.zeros(len(reqs) + 1, dtype=np.int32)
        np.cumsum(pages_np, out=indptr_np[1:])
        indices_np = np.concatenate([r.page_ids[:p] for r, p in zip(reqs, pages_np)]).astype(np.int32)
        last_np = (lens_np - 1) % ps + 1
        indptr_cpu = torch.from_numpy(indptr_np)
        return DecodeBatch(
            reqs=reqs,
            seq_lens=torch.from_numpy(lens_np).to(device, non_blocking=True),
            seq_lens_np=lens_np,
            kv_indptr=indptr_cpu.to(device, non_blocking=True),
            kv_indptr_cpu=indptr_cpu,
            kv_indices=torch.from_numpy(indices_np).to(device, non_blocking=True),
            last_page_cpu=torch.from_numpy(last_np.astype(np.int32)),
            last_tokens=torch.tensor([r.last_token for r in reqs], dtype=torch.long).to(device, non_blocking=True),
            num_pages=int(indptr_np[-1]),
        )

    def commit(self, batch: DecodeBatch, emitted, rows, counts: list):
        for req, c in zip(batch.reqs, counts):
            req.seq_len += c + 1
            req.emitted += c + 1
        self.last_emitted = (emitted, rows)


class SpecEngine:
    def __init__(self, cfg: SpecConfig, device: str = "cuda"):
        self.cfg = cfg
        self.device = torch.device(device)
        self.k = cfg.num_draft_tokens
        self.shared = SharedPageBuffers(cfg, self.device)
        self.kv = DualKVCache(cfg, self.device)
        self.draft_model = DraftModel(cfg, self.shared, self.kv.draft, self.device)
        self.target_model = TargetModel(cfg, self.kv.target, self.draft_model, self.device)
        self.draft_pool = DraftDecodePool(cfg, self.shared, self.draft_model, self.device)
        self.verify_pool = VerifyPool(cfg, self.shared, self.target_model, self.device)
        self.swapper = PoolSwapper(cfg, self.draft_pool, self.verify_pool)
        self.acceptor = Acceptor(cfg, self.shared, self.device)
        self.scheduler = SpecScheduler(cfg)

    def record_all(self):
        for bs in self.cfg.graph_batch_sizes:
            self.draft_pool.record(bs)
            self.verify_pool.record(bs)

    def describe(self) -> dict:
        layout = self.swapper._kv_layout  # ok: FC103
        return {"layout": layout, "swaps": self.swapper.swaps, "buckets": sorted(self.draft_pool.wrappers)}

    def _draft(self, batch: DecodeBatch, gbs):
        bs = batch.size
        self.swapper.swap_to("draft")
        pool = self.draft_pool
        tokens = pool.token_buf
        tokens[:bs, 0].copy_(batch.last_tokens)
        for depth in range(self.k):
            pool.input_buf[:bs].copy_(tokens[:bs, depth])
            pool.positions_buf[:bs].copy_(batch.seq_lens + depth)
            if gbs is None:
                ctx = pool.stage_eager(batch, depth)
                logits, hidden = self.draft_model.forward_draft(ctx)
            else:
                pool.stage(batch, gbs, depth)
                logits, hidden = pool.replay(gbs)
            tokens[:bs, depth + 1].copy_(logits[:bs].argmax(dim=-1))
            pool.hidden_buf[:bs].copy_(hidden[:bs])
        return tokens[:bs, 1 : self.k + 1]

    def step(self) -> int:
        batch = self.scheduler.next_batch(self.device)
        if batch is None:
            return 0
        bs = batch.size
        n = self.k + 1
        gbs = self.swapper.bucket_for(bs)
        draft_ids = self._draft(batch, gbs)

        self.swapper.swap_to("verify")
        if gbs is None:
            target_logits, target_hidden = self.verify_pool.run_eager(batch, draft_ids)
        else:
            self.verify_pool.stage(batch, draft_ids, gbs)
            target_logits, target_hidden = self.verify_pool.replay(gbs)
        target_logits = target_logits[: bs * n]
        emitted, n_acc, counts = self.acceptor.accept_tokens(draft_ids, target_logits, bs)

        # hand the target's hidden state at the last accepted position to the next draft step
        last_hidden = target_hidden[: bs * n].view(bs, n, -1)[torch.arange(bs, device=self.device), n_acc.long()]
        self.draft_pool.hidden_buf = last_hidden.clone()  # expect: FC107
        rows = torch.repeat_interleave(torch.arange(bs, device=self.device), n_acc + 1)  # expect: FC101
        self.scheduler.commit(batch, emitted, rows, counts)
        return bs
