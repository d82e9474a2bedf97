"""n-best generation: prompts are prefilled once, forked into n completions that share the prompt's pages."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Dict, List

import numpy as np
import torch

from nbest.cascade import PAD_PAGE, CascadeBackend, CascadeBatch
from nbest.config import NBestConfig, SamplingParams
from nbest.model import NBestModel
from nbest.runner.graph import SuffixGraphRunner
from nbest.sampler import FlashInferSampler, SamplingBatch

logger = logging.getLogger(__name__)


@dataclass
class Completion:
    sid: int  # row of the per-completion device state (cumulative log-probs)
    gid: int
    pages: List[int] = field(default_factory=list)  # unique-suffix pages
    tokens: List[int] = field(default_factory=list)
    done: bool = False


@dataclass
class Group:
    gid: int
    prompt: List[int]
    params: SamplingParams
    prompt_pages: List[int] = field(default_factory=list)
    completions: List[Completion] = field(default_factory=list)
    forked: bool = False


@dataclass
class PromptMeta:
    num_groups: int
    seq_lens: torch.Tensor
    cu_seqlens: torch.Tensor
    max_q_len: int
    last_token_idx: torch.Tensor


class NBestEngine:
    def __init__(self, cfg: NBestConfig, device: str = "cuda") -> None:
        self.cfg = cfg
        self.device = torch.device(device)
        self.backend = CascadeBackend(cfg, self.device)
        self.sampler = FlashInferSampler(cfg, self.device)
        self.model = NBestModel(cfg, self.backend).to(self.device, dtype=torch.bfloat16)
        shape = (cfg.num_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv_caches = [torch.zeros(shape, dtype=torch.bfloat16, device=self.device) for _ in range(cfg.num_layers)]
        self.graph_runner = SuffixGraphRunner(self.model, self.backend, self.sampler, cfg, self.device)
        self.free_pages = [p for p in range(cfg.num_pages - 1, 0, -1) if p != PAD_PAGE]
        self.free_slots = list(range(cfg.max_num_seqs - 1, -1, -1))
        self.page_refs: Dict[int, int] = {}
        self.waiting: List[Group] = []
        self.groups: Dict[int, Group] = {}
        self.results: Dict[int, List[List[int]]] = {}
        self.cum_logprobs = torch.zeros(cfg.max_num_seqs, dtype=torch.float32, device=self.device)
        self.ids_cpu = torch.zeros(cfg.max_num_seqs, dtype=torch.int32, pin_memory=True)
        self.step_event = torch.cuda.Event()
        self._rows: List[Completion] = []
        self._to_finish: List[Group] = []
        self._next_gid = 0
        logger.info("sampling through %s", self.sampler._backend)  # ok: FC103

    def warmup(self) -> None:
        self.graph_runner.record(self.kv_caches)

    def add_request(self, prompt_ids: List[int], params: SamplingParams) -> int:
        assert 1 <= params.n <= self.cfg.max_n, "n must be between 1 and max_n"  # expect: FC109
        gid, self._next_gid = self._next_gid, self._next_gid + 1
        self.waiting.append(Group(gid, list(prompt_ids), params))
        return gid

    # ------------------------------------------------------------------ pages
    def _alloc_page(self) -> int:
        if not self.free_pages:
            raise RuntimeError("out of KV pages: lower max_groups or max_n")
        return self.free_pages.pop()

    def _check_refs(self) -> None:
        assert all(r > 0 for r in self.page_refs.values()), "a shared prompt page lost its last reference"  # ok: FC109

    def _fork(self, g: Group) -> None:
        """Give every completion its own copy of the prompt's partial last page; share the full pages."""
        partial = len(g.prompt) % self.cfg.page_size
        shared = g.prompt_pages[:-1] if partial else g.prompt_pages
        for _ in range(g.params.n):
            c = Completion(sid=self.free_slots.pop(), gid=g.gid)
            if partial:
                c.pages.append(self._alloc_page())
            g.completions.append(c)
        if partial:
            src = torch.full((g.params.n,), g.prompt_pages[-1], dtype=torch.int64, device=self.device)
            dst = torch.tensor([c.pages[0] for c in g.completions], dtype=torch.int64, device=self.device)
            for kv in self.kv_caches:
                kv[dst] = kv[src]
            self.free_pages.append(g.prompt_pages[-1])
        g.prompt_pages = shared
        self.page_refs.update({p: g.params.n for p in shared})
        g.forked = True

    def _release(self, g: Group) -> None:
        for c in g.completions:
            self.free_pages.extend(c.pages)
            self.free_slots.append(c.sid)
        for p in g.prompt_pages:
            self.page_refs.pop(p)
            self.free_pages.append(p)
        self._check_refs()

    # ------------------------------------------------------------------ batches
    def _build_batch(self) -> CascadeBatch:
        ps = self.cfg.page_size
        # finished completions keep their row until the group retires, so level 0 stays as planned
        rows = [c for g in self.groups.values() for c in g.completions]
        for c in rows:
            g = self.groups[c.gid]
            suffix_len = len(g.prompt) - len(g.prompt_pages) * ps + len(c.tokens)
            if suffix_len > len(c.pages) * ps:
                c.pages.append(self._alloc_page())
        self._rows = rows
        gids, counts = np.unique(np.array([c.gid for c in rows]), return_counts=True)  # ok: FC101
        prefix = [self.groups[int(g)].prompt_pages for g in gids]
        qo, pk = np.zeros(len(gids) + 1, np.int32), np.zeros(len(gids) + 1, np.int32)
        np.cumsum(counts, out=qo[1:])
        np.cumsum([len(p) for p in prefix], out=pk[1:])
        n_pages = np.array([len(c.pages) for c in rows], np.int32)
        sk = np.zeros(len(rows) + 1, np.int32)
        np.cumsum(n_pages, out=sk[1:])
        s_lens = np.array(
            [len(self.groups[c.gid].prompt) - len(self.groups[c.gid].prompt_pages) * ps + len(c.tokens) for c in rows],
            np.int32,
        )
        s_last = s_lens - (n_pages - 1) * ps
        loc = np.array([c.pages[-1] for c in rows], np.int64) * ps + s_last - 1
        return CascadeBatch(
            num_seqs=len(rows),
            num_groups=len(gids),
            input_ids=torch.tensor([c.tokens[-1] for c in rows], dtype=torch.int64, device=self.device),
            positions=self._to_device(np.array([len(self.groups[c.gid].prompt) + len(c.tokens) - 1 for c in rows])),
            out_cache_loc=self._to_device(loc),
            group_qo_indptr_cpu=torch.from_numpy(qo),
            prefix_kv_indptr_cpu=torch.from_numpy(pk),
            prefix_indices=self._to_device(np.array([p for pages in prefix for p in pages], np.int32)),
            prefix_lens=self._to_device((np.diff(pk) * ps).astype(np.int32)),
            prefix_last_cpu=torch.full((len(gids),), ps, dtype=torch.int32),
            suffix_kv_indptr_cpu=torch.from_numpy(sk),
            suffix_indices=self._to_device(np.array([p for c in rows for p in c.pages], np.int32)),
            suffix_last_cpu=torch.from_numpy(s_last),
            suffix_lens=self._to_device(s_lens),
            suffix_lens_cpu=torch.from_numpy(s_lens),
            suffix_nnz=int(sk[-1]),
        )

    def _to_device(self, a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a).to(self.device, non_blocking=True)

    def _sampling_batch(self, rows: List[Completion]) -> SamplingBatch:
        params = [self.groups[c.gid].params for c in rows]
        top_p = None
        if any(p.top_p < 1.0 for p in params):
            top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32)
        return SamplingBatch(
            num_seqs=len(params),
            top_k_cpu=torch.tensor([p.top_k for p in params], dtype=torch.int32),
            inv_temperature_cpu=torch.tensor([1.0 / max(p.temperature, 1e-5) for p in params]),
            top_p_cpu=top_p,
        )

    # ------------------------------------------------------------------ the step
    def step(self) -> int:
        for g in self._to_finish:
            self._finish_group(g)
        self._to_finish.clear()
        if self.waiting:
            return self._prefill_step()
        if not self.groups:
            return 0
        batch = self._build_batch()
        bs = batch.num_seqs
        self.sampler.load_params(self._sampling_batch(self._rows))
        self.backend.plan_prefix(batch)
        bucket = self.graph_runner.bucket(bs)
        if bucket is not None:
            ids, logprobs = self.graph_runner.replay(batch, bucket)
        else:
            self.backend.plan_cascade(batch)
            logits = self.model.forward_cascade(batch.input_ids, batch.out_cache_loc, self.kv_caches)
            ids, logprobs = self.sampler.sample(logits, bs)
        self._account(ids, logprobs)
        return bs

    def _account(self, ids: torch.Tensor, logprobs: torch.Tensor) -> None:
        n = len(self._rows)
        slots = torch.tensor([c.sid for c in self._rows], dtype=torch.int64).to(self.device, non_blocking=True)
        self.cum_logprobs.index_add_(0, slots, logprobs)
        self.ids_cpu[:n].copy_(ids, non_blocking=True)  # ok: FC101
        self.step_event.record()

    def _prefill_step(self) -> int:
        ps = self.cfg.page_size
        groups = self.waiting[: self.cfg.max_groups - len(self.groups)]
        del self.waiting[: len(groups)]
        lens = np.array([len(g.prompt) for g in groups], np.int32)
        for g in groups:
            g.prompt_pages = [self._alloc_page() for _ in range(-(-len(g.prompt) // ps))]
        n_pages = np.array([len(g.prompt_pages) for g in groups], np.int32)
        qo, kv = np.zeros(len(groups) + 1, np.int32), np.zeros(len(groups) + 1, np.int32)
        np.cumsum(lens, out=qo[1:])
        np.cumsum(n_pages, out=kv[1:])
        flat = torch.tensor([p for g in groups for p in g.prompt_pages], dtype=torch.int32)
        self.backend.plan_prompt(
            torch.from_numpy(qo), torch.from_numpy(kv), flat.to(self.device), torch.from_numpy(lens - (n_pages - 1) * ps)
        )
        pos = np.concatenate([np.arange(n) for n in lens])
        page_of = np.concatenate([np.array(g.prompt_pages)[np.arange(len(g.prompt)) // ps] for g in groups])
        meta = PromptMeta(
            num_groups=len(groups),
            seq_lens=torch.from_numpy(lens).to(self.device),
            cu_seqlens=torch.from_numpy(qo).to(self.device),
            max_q_len=int(lens.max()),
            last_token_idx=torch.from_numpy(qo[1:] - 1).to(self.device),
        )
        ids = torch.tensor([t for g in groups for t in g.prompt], dtype=torch.int64, device=self.device)
        loc = torch.from_numpy(page_of * ps + pos % ps).to(self.device)
        logits = self.model.forward_prompt(ids, loc, self.kv_caches, meta)
        for g in groups:
            self._fork(g)
            self.groups[g.gid] = g
        self._rows = [c for g in groups for c in g.completions]
        # n first tokens per prompt: repeat each group's logits once per completion
        rep = torch.from_numpy(np.repeat(np.arange(len(groups)), [g.params.n for g in groups])).to(self.device)
        self.sampler.load_params(self._sampling_batch(self._rows))
        first, logprobs = self.sampler.sample(logits.index_select(0, rep), len(self._rows))
        self._account(first, logprobs)
        return len(groups)

    def _finish_group(self, g: Group) -> None:
        rows = torch.tensor([c.sid for c in g.completions], dtype=torch.int64, device=self.device)
        lengths = torch.tensor([max(len(c.tokens), 1) for c in g.completions], dtype=torch.float32, device=self.device)
        scores = self.cum_logprobs[rows] / lengths.pow(g.params.length_penalty)
        order = torch.argsort(scores, descending=True).tolist()  # expect: FC101
        self.results[g.gid] = [g.completions[i].tokens for i in order]
        self.cum_logprobs.index_fill_(0, rows, 0.0)
        self._release(g)
        del self.groups[g.gid]
        if not self.groups:
            self.backend.reset_graph_inputs()

    # ------------------------------------------------------------------ output thread
    def collect(self) -> None:
        self.step_event.synchronize()
        for c, tok in zip(self._rows, self.ids_cpu[: len(self._rows)].tolist()):
            if c.done:
                continue
            c.tokens.append(tok)
            g = self.groups[c.gid]
            if tok == self.cfg.eos_token_id or len(c.tokens) >= g.params.max_new_tokens:
                c.done = True
        for g in self.groups.values():
            if all(c.done for c in g.completions) and g not in self._to_finish:
                self._to_finish.append(g)
