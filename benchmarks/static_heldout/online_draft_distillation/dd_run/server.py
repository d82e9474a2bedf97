"""Speculative serving with a draft that keeps learning: draft k tokens (k draft graph replays),
verify them in one target graph replay, push the accepted pairs to the ring, and every
``train_every`` steps train the draft on a side stream and re-capture its graphs."""
from typing import List, Optional

import flashcheck
import numpy as np
import torch

from dd_attn.attention import DraftAttention, TargetAttention
from dd_attn.layout import SpecBatch
from distill import AcceptedTokenBuffer, DistillConfig, DraftTrainer

from .graphs import DraftGraphs, TargetGraphs
from .models import DraftLM, TargetLM


class SpecServer:
    def __init__(self, cfg: DistillConfig):
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self.draft_attn = DraftAttention(cfg, self.device)
        self.target_attn = TargetAttention(cfg, self.device)
        self.draft_model = DraftLM(cfg, self.draft_attn).to(self.device)
        self.target_model = TargetLM(cfg, self.target_attn).to(self.device)
        self.draft_graphs = DraftGraphs(self.draft_model, self.draft_attn, cfg, self.device)
        self.target_graphs = TargetGraphs(self.target_model, self.target_attn, cfg, self.device)
        self.buffer = AcceptedTokenBuffer(cfg.ring_tokens, cfg.hidden_size, cfg.train_batch_tokens, self.device)
        self.trainer = DraftTrainer(
            self.draft_model, self.draft_attn, self.buffer, cfg.lr, cfg.train_every, cfg.train_window
        )
        shape = (cfg.num_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv_caches = [torch.zeros(shape, dtype=torch.bfloat16, device=self.device) for _ in range(cfg.target_layers)]
        self.draft_kv = [torch.zeros(shape, dtype=torch.bfloat16, device=self.device) for _ in range(cfg.draft_layers)]
        self.bucket_of = {n: min(b for b in cfg.draft_buckets if b >= n) for n in range(1, cfg.max_bucket + 1)}
        self.accept_mirror = torch.zeros(cfg.max_batch, dtype=torch.int64, pin_memory=True)
        self.accept_event = torch.cuda.Event()
        self.page_tables: List[List[int]] = []
        self.free_pages: List[int] = list(range(cfg.num_pages))
        self.batch: Optional[SpecBatch] = None

    def start(self) -> None:
        self.draft_attn.init_buffers()
        self.draft_graphs.capture_all(self.draft_kv)
        for bs in self.cfg.draft_buckets:
            self.target_graphs.capture_verify(bs, self.kv_caches)

    @flashcheck.hot_path
    def step(self) -> None:
        batch = self.batch
        n, k = batch.num_rows, self.cfg.num_draft_tokens
        bs = self.bucket_of[n]
        draft_tokens = self.draft_graphs.replay_draft(bs, batch)
        self.target_graphs.static_draft_tokens = draft_tokens.clone()  # expect: FC107
        logits, hidden = self.target_graphs.replay(bs, batch)
        target_tokens = logits.argmax(-1)
        accepted = torch.cumprod((target_tokens[:, :k] == draft_tokens).int(), dim=1) > 0
        num_accepted = accepted.sum(1)
        # distillation pairs: the target's hidden state and token at each accepted position
        self.buffer.push(hidden[:, :k][accepted], target_tokens[:, :k][accepted])  # expect: FC101
        batch.last_tokens = target_tokens.gather(1, num_accepted[:, None]).squeeze(1)
        self.accept_mirror[:n].copy_(num_accepted, non_blocking=True)  # ok: FC101
        self.accept_event.record()
        if self.trainer.maybe_train():
            torch.cuda.current_stream().wait_event(self.trainer.updated)
            self.draft_graphs.capture_all(self.draft_kv)

    def advance(self) -> List[int]:
        """Between steps: read the acceptance counts and grow the host page tables."""
        self.accept_event.synchronize()
        batch = self.batch
        counts = self.accept_mirror[: batch.num_rows].tolist()
        seq = batch.seq_lens_np + np.asarray(counts) + 1
        for table, s in zip(self.page_tables, seq):
            while len(table) * self.cfg.page_size < s + self.cfg.num_draft_tokens + 1:
                table.append(self.free_pages.pop())
        indptr = np.cumsum([0] + [len(t) for t in self.page_tables]).astype(np.int32)
        flat = [p for t in self.page_tables for p in t]
        self.batch = SpecBatch(
            num_rows=batch.num_rows, num_pages=len(flat), kv_indptr_cpu=torch.from_numpy(indptr),
            kv_indices=torch.tensor(flat, dtype=torch.int32, device=self.device), seq_lens_np=seq,
            last_tokens=batch.last_tokens,
        )
        return counts
