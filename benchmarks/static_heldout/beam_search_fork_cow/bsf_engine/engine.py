"""The beam search engine: admits a group of requests of one beam width, prefills their prompts, then
runs one beam step per ``step`` call (graph replay for the widths that have one)."""
from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Deque, Iterator, List, Optional

import torch

from bsf.config import BeamConfig
from bsf.kernels.cow_copy import PageCopier
from bsf.pages import CowPageTable
from bsf.scoring import FinishedHeap, length_normalize, split_parent_token
from bsf_engine.attention import BeamDecodeAttention
from bsf_engine.forker import PageForker
from bsf_engine.graph_bank import BeamGraphBank
from bsf_engine.model import BeamLM


@dataclass
class BeamRequest:
    rid: int
    prompt_ids: List[int]
    beam_width: int
    max_new_tokens: int
    beams: List[List[int]] = field(default_factory=list)
    finished: Optional[FinishedHeap] = None


@dataclass
class BeamStep:
    width: int
    n_req: int
    scores: Optional[torch.Tensor] = None
    tokens: Optional[torch.Tensor] = None
    parents: Optional[torch.Tensor] = None


class BeamSearchEngine:
    def __init__(self, cfg: BeamConfig, device: torch.device):
        self.cfg, self.device = cfg, device
        self.table = CowPageTable(cfg)
        self.attn = BeamDecodeAttention(cfg, self.table, device)
        self.model = BeamLM(cfg).to(device)
        shape = (cfg.num_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv_cache = [torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(cfg.num_layers)]
        self.forker = PageForker(cfg, self.table, self.attn, PageCopier(self.kv_cache, device))
        self.bank = BeamGraphBank(self.model, self.attn, self.kv_cache, cfg, device)
        self.waiting: Deque[BeamRequest] = collections.deque()
        self.active: List[BeamRequest] = []
        self.active_width = 0
        self.steps = 0
        rows = cfg.max_rows
        self.last_tokens = torch.zeros(rows, dtype=torch.int64, device=device)
        self.positions = torch.zeros(rows, dtype=torch.int64, device=device)
        self.tokens_pinned = torch.zeros(rows, dtype=torch.int64, pin_memory=True)
        self.parents_pinned = torch.zeros(rows, dtype=torch.int64, pin_memory=True)
        self.scores_pinned = torch.zeros(2 * rows, dtype=torch.float32, pin_memory=True)
        self.step_done = torch.cuda.Event()
        self.history: List[BeamStep] = []

    @torch.inference_mode()
    def warmup(self) -> None:
        for width in self.cfg.graph_widths:
            self.bank.record_width(width)

    def add_request(self, rid: int, prompt_ids: List[int], beam_width: int, max_new_tokens: int) -> None:
        assert beam_width in self.cfg.beam_widths  # expect: FC109
        if len(prompt_ids) > self.cfg.max_prompt_len:
            raise ValueError(f"request {rid}: {len(prompt_ids)} prompt tokens > {self.cfg.max_prompt_len}")
        self.waiting.append(BeamRequest(rid, list(prompt_ids), beam_width, max_new_tokens))
        if len(prompt_ids) + max_new_tokens > self.cfg.max_prompt_len + self.cfg.max_new_tokens:
            for width in self.attn.graph_decode:
                if width not in self.bank.graphs:
                    self.attn.grow_indices(width, width * self.cfg.max_requests * self.cfg.pages_per_seq * 2)

    def _admit(self) -> None:
        width, ps, dev = self.waiting[0].beam_width, self.cfg.page_size, self.device
        group: List[BeamRequest] = []
        while self.waiting and self.waiting[0].beam_width == width and len(group) < self.cfg.max_requests:
            group.append(self.waiting.popleft())
        pages, slots, ids, pos, last_idx = [], [], [], [], []
        for r in group:
            n = len(r.prompt_ids)
            p = self.table.alloc((n + ps - 1) // ps)
            pages.append(p)
            slots += [p[j // ps] * ps + j % ps for j in range(n)]
            ids += r.prompt_ids
            pos += range(n)
            last_idx.append(len(ids) - 1)
        as_dev = lambda xs: torch.tensor(xs, dtype=torch.int64).to(dev, non_blocking=True)  # noqa: E731
        self.attn.prefill_prompts([len(r.prompt_ids) for r in group], pages, as_dev(slots))
        top = self.model.forward_prompt(as_dev(ids), as_dev(pos), self.attn, self.kv_cache, as_dev(last_idx)).topk(width, dim=-1)
        for i, r in enumerate(group):
            self.table.set_row(i * width, pages[i], len(r.prompt_ids), len(r.prompt_ids) // ps)
            r.beams = [[] for _ in range(width)]
            r.finished = FinishedHeap(width)
        rows = len(group) * width
        # every beam starts as a fork of beam 0: shared full prompt pages, own copy of a partial one
        parent_rows = [i * width for i in range(len(group)) for _ in range(width)]
        self.forker.fork_step(width, len(group), parent_rows, as_dev(parent_rows))
        self.last_tokens[:rows].copy_(top.indices.flatten())
        self.positions[:rows].copy_(as_dev([len(r.prompt_ids) for r in group for _ in range(width)]))
        self.bank.static_cum_logprobs[:rows].copy_(top.values.flatten())
        self.tokens_pinned[:rows].copy_(top.indices.flatten(), non_blocking=True)
        self.active, self.active_width, self.steps = group, width, 0

    @torch.inference_mode()
    def step(self) -> int:
        if not self.active:
            if not self.waiting:
                return 0
            self._admit()
        width, n_req = self.active_width, len(self.active)
        rows = n_req * width
        self.attn.prepare_beams(width, n_req)
        if width in self.bank.graphs:
            vals, idx = self.bank.replay_width(width, self.last_tokens[:rows], self.positions[:rows])
            vals, idx = vals[:n_req], idx[:n_req]
        else:
            logp = self.model.forward_beams(self.last_tokens[:rows], self.positions[:rows], self.attn, self.kv_cache)
            total = logp + self.bank.static_cum_logprobs[:rows].unsqueeze(-1)
            vals, idx = total.view(n_req, -1).topk(2 * width, dim=-1)
        bstep = BeamStep(width, n_req)
        bstep.scores = torch.empty(n_req, 2 * width, dtype=torch.float32, device=self.device)  # ok: FC107
        bstep.scores.copy_(length_normalize(vals, self.positions[:rows:width].unsqueeze(-1) + 1, self.cfg.length_penalty))
        parent_local, tokens = split_parent_token(idx[:, :width], self.cfg.vocab_size)
        parents = (parent_local + torch.arange(n_req, device=self.device).unsqueeze(1) * width).flatten()
        bstep.tokens, bstep.parents = tokens, parents
        self.bank.static_cum_logprobs = vals[:, :width].reshape(-1).clone()  # expect: FC107
        parent_rows = parents.tolist()  # expect: FC101
        self.table.seq_lens_np[:rows] += 1
        self.forker.fork_step(width, n_req, parent_rows, parents)
        self.last_tokens[:rows].copy_(tokens.flatten())
        self.positions[:rows].add_(1)
        self.scores_pinned[: n_req * 2 * width].copy_(bstep.scores.flatten(), non_blocking=True)  # ok: FC101
        self.tokens_pinned[:rows].copy_(tokens.flatten(), non_blocking=True)
        self.parents_pinned[:rows].copy_(parents, non_blocking=True)
        self.step_done.record()
        self.history.append(bstep)
        self.steps += 1
        return rows

    def collect(self) -> Iterator[BeamRequest]:
        """Output thread: after the step's copies land, extend the beams and yield finished requests."""
        self.step_done.synchronize()
        width, eos = self.active_width, self.cfg.eos_token_id
        toks, parents = self.tokens_pinned.tolist(), self.parents_pinned.tolist()
        scores = self.scores_pinned.view(-1, 2 * width)
        for i, r in enumerate(self.active):
            old = r.beams
            r.beams = [old[parents[i * width + b] - i * width] + [toks[i * width + b]] for b in range(width)]
            for b, beam in enumerate(r.beams):
                if beam[-1] == eos:
                    r.finished.push(float(scores[i, b]), beam)
            if self.steps >= r.max_new_tokens or r.finished.is_done(float(scores[i, 0])):
                yield r
        self.active = [r for r in self.active if self.steps < r.max_new_tokens and not r.finished.is_done(-1e30)]
        if not self.active:
            for row in range(self.cfg.max_rows):
                self.table.release_row(row)
