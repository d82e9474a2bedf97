"""The structured-output server loop.

Every step either prefills new prompts (ragged), prefills the tokens jump-forward decoding appended (paged extend), or
decodes one token per running request (a CUDA graph per bucket, eager when graphs are off); sampling is masked by
each request's grammar matcher, and forced continuations are appended right after.
"""
from collections import deque
from dataclasses import dataclass, field
from typing import Deque, List, Optional, Sequence, Tuple

import numpy as np
import torch

import flashcheck
from sjson.config import ServerConfig
from sjson.grammar.fsm import GrammarMatcher, SchemaCompiler
from sjson.grammar.jump_forward import JumpForwardDecoder
from sjson_rt.attention import StructuredAttention
from sjson_rt.graphs import DecodeGraphRunner
from sjson_rt.kv_pool import PagedKVPool
from sjson_rt.model import JsonLM
from sjson_rt.sampler import GrammarSampler


@dataclass
class Request:
    rid: int
    prompt_ids: List[int]
    max_new_tokens: int
    matcher: GrammarMatcher
    min_new_tokens: int = 0
    pages: List[int] = field(default_factory=list)
    output_ids: List[int] = field(default_factory=list)
    seq_len: int = 0
    pending_extend: int = 0

    @property
    def done(self) -> bool:
        return self.matcher.terminated or len(self.output_ids) >= self.max_new_tokens


@dataclass
class StepBatch:
    reqs: List[Request]
    input_ids: torch.Tensor
    positions: torch.Tensor
    page_ids_cpu: torch.Tensor
    pages_per_req_cpu: torch.Tensor
    last_len_cpu: torch.Tensor
    last_rows: List[int] = field(default_factory=list)
    extend_lens_cpu: Optional[torch.Tensor] = None

    @property
    def size(self) -> int:
        return len(self.reqs)


class DecodeState:
    """Device-side per-slot flags that the sampler and the stop check share."""

    def __init__(self, max_bs: int, device: torch.device):
        self.finished = torch.zeros(max_bs, dtype=torch.bool, device=device)

    @property
    def num_finished(self) -> int:
        return int(self.finished.sum())  # expect: FC101


class StructuredServer:
    def __init__(self, cfg: ServerConfig, vocab: Sequence[str], device: torch.device):
        self.cfg = cfg
        self.device = device
        self.compiler = SchemaCompiler(vocab, cfg.max_schema_depth)
        self.pool = PagedKVPool(cfg, device)
        self.attn = StructuredAttention(cfg, device)
        self.model = JsonLM(cfg, self.attn, self.pool).to(device)
        self.graph_runner = DecodeGraphRunner(cfg, self.model, self.attn, device)
        self.sampler = GrammarSampler(cfg, device)
        self.jump_forward = JumpForwardDecoder(self.attn, cfg.max_jump_forward, device)
        self.state = DecodeState(cfg.max_batch_size, device)
        self.eos_dev = torch.tensor(cfg.eos_token_id, dtype=torch.int64, device=device)
        self.waiting: Deque[Request] = deque()
        self.running: List[Request] = []
        self._next_rid = 0

    # ------------------------------------------------------------------ admission
    def add_request(self, prompt_ids: List[int], schema: dict, max_new_tokens: int, min_new_tokens: int = 0) -> int:
        assert len(prompt_ids) + max_new_tokens <= self.cfg.max_seq_len, "request does not fit the context window"  # expect: FC109
        grammar = self.compiler.compile(schema)
        rid = self._next_rid
        self._next_rid += 1
        self.waiting.append(Request(rid, list(prompt_ids), max_new_tokens, GrammarMatcher(grammar), min_new_tokens))
        return rid

    def _admit(self) -> List[Request]:
        admitted = []
        while self.waiting and len(self.running) + len(admitted) < self.cfg.max_batch_size:
            req = self.waiting[0]
            need = (len(req.prompt_ids) + self.cfg.page_size - 1) // self.cfg.page_size
            if need > len(self.pool.free_pages):
                break
            self.waiting.popleft()
            req.pages = self.pool.alloc(need)
            admitted.append(req)
        return admitted

    # ------------------------------------------------------------------ batch building (host)
    def _page_tables(self, reqs: List[Request], lens: List[int]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        pages_per_req = [(n + self.cfg.page_size - 1) // self.cfg.page_size for n in lens]
        flat = [p for req, k in zip(reqs, pages_per_req) for p in req.pages[:k]]
        last = [(n - 1) % self.cfg.page_size + 1 for n in lens]
        return (
            torch.tensor(flat, dtype=torch.int32),
            torch.tensor(pages_per_req, dtype=torch.int32),
            torch.tensor(last, dtype=torch.int32),
        )

    def _grow_pages(self, req: Request, new_len: int) -> None:
        need = (new_len + self.cfg.page_size - 1) // self.cfg.page_size
        if need > len(req.pages):
            req.pages.extend(self.pool.alloc(need - len(req.pages)))

    def _build_decode(self, reqs: List[Request]) -> StepBatch:
        ids = [req.output_ids[-1] for req in reqs]
        pos = [req.seq_len for req in reqs]
        for req in reqs:
            self._grow_pages(req, req.seq_len + 1)
        page_ids, per_req, last = self._page_tables(reqs, [req.seq_len + 1 for req in reqs])
        return StepBatch(
            reqs,
            torch.tensor(ids, dtype=torch.int64).to(self.device, non_blocking=True),
            torch.tensor(pos, dtype=torch.int64).to(self.device, non_blocking=True),
            page_ids, per_req, last,
        )

    def _build_extend(self, reqs: List[Request]) -> StepBatch:
        ids: List[int] = []
        pos: List[int] = []
        rows: List[int] = []
        for req in reqs:
            run = req.output_ids[len(req.output_ids) - req.pending_extend :]
            ids.extend(run)
            pos.extend(range(req.seq_len, req.seq_len + len(run)))
            rows.append(len(ids) - 1)
            self._grow_pages(req, req.seq_len + len(run))
        lens = [req.seq_len + req.pending_extend for req in reqs]
        page_ids, per_req, last = self._page_tables(reqs, lens)
        return StepBatch(
            reqs,
            torch.tensor(ids, dtype=torch.int64).to(self.device, non_blocking=True),
            torch.tensor(pos, dtype=torch.int64).to(self.device, non_blocking=True),
            page_ids, per_req, last, rows,
            torch.tensor([req.pending_extend for req in reqs], dtype=torch.int32),
        )

    # ------------------------------------------------------------------ forward
    def _run_prefill(self, reqs: List[Request]) -> torch.Tensor:
        ids = [t for req in reqs for t in req.prompt_ids]
        pos = [i for req in reqs for i in range(len(req.prompt_ids))]
        rows = list(np.cumsum([len(req.prompt_ids) for req in reqs]) - 1)
        self.attn.plan_prefill(torch.tensor([len(req.prompt_ids) for req in reqs], dtype=torch.int32))
        logits = self.model.forward_prefill(
            torch.tensor(ids, dtype=torch.int64).to(self.device, non_blocking=True),
            torch.tensor(pos, dtype=torch.int64).to(self.device, non_blocking=True),
            [int(r) for r in rows],
        )
        for req in reqs:
            req.seq_len = len(req.prompt_ids)
        return logits

    def _run_extend(self, batch: StepBatch) -> torch.Tensor:
        self.attn.plan_extend(batch.size, batch.extend_lens_cpu, batch.page_ids_cpu, batch.pages_per_req_cpu, batch.last_len_cpu)
        logits = self.model.forward_extend(batch.input_ids, batch.positions, batch.last_rows)
        for req in batch.reqs:
            req.seq_len += req.pending_extend
            req.pending_extend = 0
        return logits

    def _run_decode(self, batch: StepBatch) -> torch.Tensor:
        bucket = self.attn.bucket_for(batch.size)
        if self.attn.use_graph and bucket is not None:
            logits = self.graph_runner.replay(bucket, batch.size, batch.input_ids, batch.positions, batch.page_ids_cpu, batch.pages_per_req_cpu, batch.last_len_cpu)
        else:
            self.attn.plan_decode_eager(batch.size, batch.page_ids_cpu, batch.pages_per_req_cpu, batch.last_len_cpu)
            logits = self.model.forward_decode(batch.input_ids, batch.positions, batch.size)
        for req in batch.reqs:
            req.seq_len += 1
        return logits

    # ------------------------------------------------------------------ the step
    @flashcheck.hot_path
    def step(self) -> List[Tuple[int, List[int]]]:
        admitted = self._admit()
        if admitted:
            reqs = admitted
            logits = self._run_prefill(admitted)
            self.running.extend(admitted)
        elif not self.running:
            return []
        else:
            extending = [req for req in self.running if req.pending_extend > 0]
            if extending:
                reqs = extending
                logits = self._run_extend(self._build_extend(extending))
            else:
                reqs = list(self.running)
                logits = self._run_decode(self._build_decode(reqs))
        bs = len(reqs)
        left = [req.min_new_tokens - len(req.output_ids) for req in reqs]
        next_tokens = self.sampler.sample(logits, [req.matcher for req in reqs], left)
        self.state.finished[:bs] |= next_tokens == self.eos_dev
        next_tokens = torch.where(self.state.finished[:bs], self.eos_dev, next_tokens)  # ok: FC101
        token_list = next_tokens.tolist()  # expect: FC101
        for req, tok in zip(reqs, token_list):
            req.output_ids.append(tok)
            if not req.matcher.advance(tok):
                req.matcher.terminated = True
        runs = self.jump_forward.collect(reqs)
        self.jump_forward.apply(reqs, runs)
        if self.state.num_finished == bs:
            self.state.finished.zero_()
        return self._retire()

    def _retire(self) -> List[Tuple[int, List[int]]]:
        done = [req for req in self.running if req.done]
        if not done:
            return []
        self.running = [req for req in self.running if not req.done]
        for req in done:
            self.pool.free(req.pages)
            req.pages = []
        return [(req.rid, req.output_ids) for req in done]
