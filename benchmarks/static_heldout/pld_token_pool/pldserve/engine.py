"""The engine loop: prompt lookup drafts on the host, one verify forward, greedy acceptance, slot roll-back."""
import logging
from dataclasses import dataclass, field

import numpy as np
import torch

from pldserve.attn import DECODE_BUCKETS, PLDFlashInferState
from pldserve.graph import BucketGraph
from pldserve.lookup import PromptLookup
from pldserve.mem.token_pool import TokenKVPool
from pldserve.model import PLDModel

logger = logging.getLogger(__name__)


@dataclass
class Request:
    rid: int
    history_np: np.ndarray
    max_new_tokens: int
    slots_host: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    num_generated: int = 0
    finished: bool = False


class PLDEngine:
    def __init__(self, cfg, device="cuda"):
        self.cfg = cfg
        self.device = device
        self.pool = TokenKVPool(cfg.max_total_tokens, cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, cfg.dtype, device)
        self.attn = PLDFlashInferState(cfg, self.pool, device)
        self.attn.init_graph_buffers()
        self.model = PLDModel(cfg, self.attn).to(device)
        self.graphs = BucketGraph(self.model, self.attn, device)
        self.lookup = PromptLookup(cfg.max_ngram, cfg.num_draft_tokens)
        self.requests: list[Request] = []
        self.accept_buf = None
        self.last_drafts_host = None

    def add_request(self, rid: int, prompt_ids: list[int], max_new_tokens: int):
        assert len(prompt_ids) + max_new_tokens <= self.cfg.max_seq_len  # expect: FC109
        self.requests.append(Request(rid, np.asarray(prompt_ids, dtype=np.int32), max_new_tokens))

    def capture_all(self):
        for bs in DECODE_BUCKETS:
            self.graphs.record(bs)
            self.graphs.record_verify(bs)

    def step(self):
        reqs = [r for r in self.requests if not r.finished]
        bs, k = len(reqs), self.cfg.num_draft_tokens
        if bs == 0 or self.pool.available() < bs * (k + 1):
            return
        drafts = [self.lookup.propose(r.history_np) for r in reqs]
        draft_lens_cpu = np.array([len(d) for d in drafts], dtype=np.int32)
        if draft_lens_cpu.max() > 0 or bs > DECODE_BUCKETS[-1]:
            return self._verify_step(reqs, drafts, draft_lens_cpu)
        for r, s in zip(reqs, self.pool.alloc(bs)[0]):
            r.slots_host = np.append(r.slots_host, s)
        seq_lens_cpu = np.array([len(r.slots_host) for r in reqs], dtype=np.int32)
        ids = torch.tensor([int(r.history_np[-1]) for r in reqs], dtype=torch.int64)
        pos = torch.from_numpy(seq_lens_cpu.astype(np.int64) - 1)
        logits = self.graphs.replay(bs, ids.to(self.device), pos.to(self.device), [r.slots_host for r in reqs], seq_lens_cpu)
        self._commit(reqs, torch.zeros(bs, dtype=torch.int64, device=self.device), logits.argmax(-1)[:, None])

    def _verify_step(self, reqs: list[Request], drafts: list[list[int]], draft_lens_cpu: np.ndarray):
        bs, k = len(reqs), self.cfg.num_draft_tokens
        self.last_drafts_host = torch.zeros((bs, k), dtype=torch.int64, pin_memory=True)  # ok: FC107
        q_tokens, q_pos = [], []
        for i, (r, d) in enumerate(zip(reqs, drafts)):
            r.slots_host = np.concatenate([r.slots_host, self.pool.alloc(len(d) + 1)[0]])
            start = len(r.slots_host) - len(d) - 1
            q_tokens += [int(r.history_np[-1]), *d]
            q_pos += range(start, start + len(d) + 1)
            self.last_drafts_host[i, : len(d)] = torch.tensor(d, dtype=torch.int64)
        kv_indptr_cpu = torch.tensor(np.cumsum([0] + [len(r.slots_host) for r in reqs]), dtype=torch.int32)
        flat_slots = torch.from_numpy(np.concatenate([r.slots_host for r in reqs]))
        total = int(kv_indptr_cpu[-1])
        draft_lens_gpu = torch.from_numpy(draft_lens_cpu).to(self.device, non_blocking=True)
        # the verify wrapper borrows the decode graphs' index buffer instead of allocating its own
        self.attn.plan_verify(bs, draft_lens_gpu, kv_indptr_cpu, self.attn.kv_indices[:total])
        self.attn.kv_indices[:total].copy_(flat_slots, non_blocking=True)  # expect: FC104
        logits = self.model.forward_verify(
            torch.tensor(q_tokens).to(self.device, non_blocking=True), torch.tensor(q_pos).to(self.device, non_blocking=True)
        )
        target = torch.full((bs, k + 1), -1, dtype=torch.int64, device=self.device)
        offsets = np.cumsum([0, *(draft_lens_cpu + 1)])
        for i in range(bs):
            target[i, : draft_lens_cpu[i] + 1] = logits[offsets[i] : offsets[i + 1]].argmax(-1)
        match = (self.last_drafts_host.to(self.device, non_blocking=True) == target[:, :k]).int()
        if self.accept_buf is None:
            self.accept_buf = torch.zeros(self.cfg.max_batch_size, dtype=torch.int64, device=self.device)  # ok: FC107
        torch.minimum(match.cumprod(dim=1).sum(dim=1), draft_lens_gpu.long(), out=self.accept_buf[:bs])
        self._commit(reqs, self.accept_buf[:bs], target)

    def prefill(self, reqs: list[Request]):
        kv_lens = [len(r.history_np) for r in reqs]
        for r, n in zip(reqs, kv_lens):
            r.slots_host = self.pool.alloc(n)[0]
        slots_gpu = torch.from_numpy(np.concatenate([r.slots_host for r in reqs])).to(self.device, non_blocking=True)
        self.attn.plan_prefill(kv_lens, kv_lens, slots_gpu)
        ids = torch.from_numpy(np.concatenate([r.history_np for r in reqs]).astype(np.int64)).to(self.device)
        logits = self.model.forward_eager(ids, torch.zeros_like(ids), prefill=True)
        self._commit(reqs, torch.zeros(len(reqs), dtype=torch.int64, device=self.device), logits[np.cumsum(kv_lens) - 1, None].argmax(-1))

    def _commit(self, reqs: list[Request], accept_len: torch.Tensor, target: torch.Tensor):
        rows = torch.cat([accept_len[:, None], target], dim=1).tolist()  # expect: FC101
        logger.debug("accepted lengths %s", accept_len)  # ok: FC101
        for r, row in zip(reqs, rows):
            n_acc, new_tokens = row[0], row[1 : row[0] + 2]
            r.history_np = np.concatenate([r.history_np, np.asarray(new_tokens, dtype=np.int32)])
            keep = len(r.slots_host) - (len(row) - 2 - n_acc)
            if keep < len(r.slots_host):
                self.pool.free(r.slots_host[keep:])
                r.slots_host = r.slots_host[:keep]
            r.num_generated += len(new_tokens)
            r.finished = r.num_generated >= r.max_new_tokens
