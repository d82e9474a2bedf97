"""The engine: a step is a DAG of named callables run in topological order."""

import logging
from collections import deque
from typing import Callable, Deque, Dict, List, Optional, Tuple

import torch

from dagstep.batch import Request, StepContext, build_step_batch
from dagstep.config import PAGE_SIZE, EngineConfig
from dagstep_attn.backend import FlashInferBackend
from dagstep_exec.dag import StepGraph
from dagstep_exec.graph_runner import GraphRunner
from dagstep_exec.model import DecoderModel

logger = logging.getLogger(__name__)

DEPS: Dict[str, Tuple[str, ...]] = {
    "schedule": (), "prepare": ("schedule",), "plan": ("prepare",),
    "run": ("plan",), "sample": ("run",), "postprocess": ("sample",),
}

class DagEngine:
    def __init__(self, cfg: EngineConfig, device: torch.device, num_pages: int = 65536):
        self.cfg = cfg
        self.device = device
        self.backend = FlashInferBackend(cfg, device)
        self.model = DecoderModel(cfg, self.backend)
        self.runner = GraphRunner(cfg, self.model, self.backend)
        self.eos_id = 2
        self.next_ids = torch.zeros(cfg.max_num_seqs, dtype=torch.int64, device=device)
        self.greedy_logprob_sum = torch.zeros((), dtype=torch.float32, device=device)
        self.stages: Dict[str, Callable[[StepContext], None]] = {
            "schedule": self._schedule,
            "prepare": self._prepare,
            "plan": self.backend.plan_step,
            "run": self._run,
            "sample": self._sample,
            "postprocess": self._postprocess,
        }
        self.dag = StepGraph(DEPS)
        self.waiting: Deque[Request] = deque()
        self.running: List[Request] = []
        self.free_pages: List[int] = list(range(num_pages))
        self.holes = self.step_id = 0
        self.positions_buf = torch.zeros(cfg.max_num_tokens, dtype=torch.int64, device=device)
        self.temps_buf: Optional[torch.Tensor] = None
        self.ids_host = torch.zeros(cfg.max_num_seqs, dtype=torch.int64, pin_memory=True)
        self.finished_host = torch.zeros(cfg.max_num_seqs, dtype=torch.bool, pin_memory=True)
        self.lens_cpu = torch.zeros(0, dtype=torch.int32)
        self.prev_indptr_cpu = torch.zeros(1, dtype=torch.int32)
        self.copy_done = torch.cuda.Event()
        self.num_finished = 0

    def start(self) -> None:
        self.runner.capture_all()
        logger.info("captured %d buckets on %s", len(self.runner.entries), type(self.runner._backend).__name__)  # ok: FC103

    def add_request(self, req: Request) -> None:
        assert len(req.prompt) > 0, "empty prompt"  # expect: FC109
        self.waiting.append(req)

    def _alloc_pages(self, n: int) -> List[int]:
        assert n <= len(self.free_pages), "page pool exhausted"  # ok: FC109
        pages, self.free_pages = self.free_pages[:n], self.free_pages[n:]
        return pages

    def _schedule(self, ctx: StepContext) -> None:
        if self.holes > 1024:
            self.backend.defragment()
            self.holes = 0
        prefill = bool(self.waiting)
        if prefill:
            while self.waiting and len(self.running) < self.cfg.max_num_seqs:
                req = self.waiting.popleft()
                req.pages = self._alloc_pages((len(req.prompt) + PAGE_SIZE) // PAGE_SIZE + 1)
                self.running.append(req)
        if not self.running:
            return
        ctx.batch = build_step_batch(self.running, self.device, is_prefill=prefill)

    def _prepare(self, ctx: StepContext) -> None:
        b = ctx.batch
        n = int(b.input_ids.numel())  # ok: FC101
        if n > self.positions_buf.numel():
            self.positions_buf = torch.empty(n, dtype=torch.int64, device=self.device)  # expect: FC107
        if self.temps_buf is None:
            self.temps_buf = torch.empty(self.cfg.max_num_seqs, device=self.device)  # ok: FC107
        self.temps_buf[: b.num_seqs].copy_(b.temperatures)  # ok: FC101
        self.backend.cu_seqlens_q = b.query_start_loc.clone()  # expect: FC107
        if (b.seq_lens > self.cfg.long_context).any():  # expect: FC101
            logger.warning("long-context rows in step %d", ctx.step)
        total = int(b.query_lens_np.sum())  # ok: FC101
        starts = b.seq_lens - b.query_lens
        base = torch.repeat_interleave(starts, b.query_lens)  # expect: FC101
        row_start = torch.repeat_interleave(b.query_start_loc[:-1], b.query_lens, output_size=total)  # ok: FC101
        offs = torch.arange(total, device=self.device) - row_start
        self.positions_buf[:total].copy_(base + offs)
        multi = [i for i, q in enumerate(b.query_lens_np) if q > 1]  # ok: FC101
        logger.debug("prepare: %d multi-token rows, lens %s", len(multi), b.seq_lens)  # ok: FC101
        if b.num_seqs > self.cfg.max_num_seqs:
            raise ValueError(f"batch of {b.num_seqs} sequences, lens {b.seq_lens}")  # ok: FC101
        if not torch.equal(self.prev_indptr_cpu, b.kv_indptr_cpu):  # ok: FC101
            self.prev_indptr_cpu = b.kv_indptr_cpu.clone()
        ctx.scratch = torch.zeros(total, self.cfg.num_heads, device=self.device)  # ok: FC107

    def _run(self, ctx: StepContext) -> None:
        b = ctx.batch
        logger.info(f"step {ctx.step}: {b.num_seqs} seqs, lens={b.seq_lens}")  # expect: FC101
        if b.is_prefill:
            ctx.logits = self.model.forward_extend(b)
            return
        if b.num_seqs <= self.cfg.max_bucket:
            ctx.logits = self.runner.replay(b)
            return
        ctx.logits = self.model.forward_decode(b.input_ids, self.positions_buf[: b.num_seqs])
        torch.cuda.synchronize()  # expect: FC101

    def _sample(self, ctx: StepContext) -> None:
        b = ctx.batch
        logits = ctx.logits
        temps = b.temperatures
        if self.next_ids.numel() < b.num_seqs:
            self.next_ids.resize_(b.num_seqs)  # expect: FC107
        greedy = logits.argmax(-1)
        probs = torch.softmax(logits / temps.clamp(min=1e-5)[:, None], dim=-1)
        sampled = torch.multinomial(probs, 1).squeeze(-1)
        ids = torch.where(temps == 0, greedy, sampled)  # ok: FC101
        greedy_lp = torch.log_softmax(logits[temps == 0], dim=-1)  # expect: FC101
        self.greedy_logprob_sum += greedy_lp.amax(-1).sum()
        self.next_ids[: b.num_seqs].copy_(ids)
        ctx.next_ids = self.next_ids[: b.num_seqs]
        ctx.finished = ids == self.eos_id

    def _postprocess(self, ctx: StepContext) -> None:
        b = ctx.batch
        n = b.num_seqs
        self.ids_host[:n].copy_(ctx.next_ids, non_blocking=True)  # ok: FC101
        self.copy_done.record()
        self.copy_done.synchronize()  # expect: FC101
        toks = self.ids_host[:n].tolist()  # ok: FC101
        self.num_finished += sum(ctx.finished)  # expect: FC101
        if self.finished_host.numel() < n:
            self.finished_host = torch.empty(n, dtype=torch.bool, pin_memory=True)  # ok: FC107
        self.finished_host[:n].copy_(ctx.finished)  # expect: FC101
        done_rows = ctx.finished.nonzero().squeeze(-1)  # expect: FC101
        logger.debug("finished rows %s", done_rows)
        keep: List[Request] = []
        for i, req in enumerate(self.running):
            req.output.append(toks[i])
            if self.finished_host[i]:  # ok: FC101
                self._finish(req, i)
            else:
                keep.append(req)
        self.running = keep
        self.lens_cpu = torch.cat([b.seq_lens_cpu, self.lens_cpu])[: self.cfg.max_num_seqs]  # ok: FC107

    def _finish(self, req: Request, row: int) -> None:
        self.backend.release_request(req.pages[0], len(req.pages), row)
        self.free_pages.extend(req.pages)
        self.holes, req.pages = self.holes + len(req.pages), []

    def step(self) -> List[Tuple[str, int]]:
        ctx = StepContext(step=self.step_id)
        for name in self.dag.order:
            self.stages[name](ctx)
            if name == "schedule" and ctx.batch is None:
                return []
        assert ctx.batch is not None  # ok: FC109
        self.step_id += 1
        return [(r.rid, r.output[-1]) for r in self.running if r.output]
