"""Decode graphs per bucket, and the step as coroutines (schedule -> prepare -> run -> sample) fed with send()."""

import itertools
import logging
from dataclasses import dataclass, field
from typing import Dict, Generator, Iterator, List, Optional, Tuple

import numpy as np
import torch

from rwkvserve import PAGE_SIZE, AttnMeta, HybridConfig, Request, Scheduler, StepPlan, build_attn_meta
from hyb_attn.backend import HybridAttnBackend
from hyb_engine.model import HybridModel, RecurrentStateCache

logger = logging.getLogger(__name__)

_STATIC_INPUTS = ("positions", "state_slots")

class DecodeGraphs:
    def __init__(self, cfg: HybridConfig, model: HybridModel, backend: HybridAttnBackend, device: torch.device):
        self.cfg, self.model, self.backend, self.device = cfg, model, backend, device
        self.input_ids = torch.zeros(cfg.max_bucket, dtype=torch.int64, device=device)
        self.positions = torch.zeros(cfg.max_bucket, dtype=torch.int64, device=device)
        self.state_slots = torch.zeros(cfg.max_bucket, dtype=torch.int64, device=device)
        self.graphs: Dict[int, Tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.sampled: Dict[int, torch.Tensor] = {}
        self.mempool = torch.cuda.graph_pool_handle()
        self.stream = torch.cuda.Stream(device=device)

    def bucket_for(self, n: int) -> Optional[int]:
        return next((bs for bs in self.cfg.buckets if bs >= n), None)

    def capture_all(self) -> None:
        assert not self.graphs, "decode graphs were already captured"  # ok: FC109
        self.backend.init_graph_state()
        for bs in sorted(self.cfg.buckets, reverse=True):
            self.record_bucket(bs)
        if not bool(self.graphs[1][1].isfinite().all().item()):  # ok: FC101
            raise RuntimeError("the bucket-1 decode graph produced non-finite logits while capturing")

    def record_bucket(self, bs: int) -> None:
        meta = self.backend.plan_dummy(bs)
        # capture with full last pages so the kernels take their multi-page path
        self.backend.last_page_buf[:bs].fill_(PAGE_SIZE)  # expect: FC104
        meta = meta._replace(positions=self.positions[:bs], state_slots=self.state_slots[:bs])
        self.sampled[bs] = torch.empty(bs, dtype=torch.int64, device=self.device)  # ok: FC107
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            self.model.decode(self.input_ids[:bs], meta, capturing=True)
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempool, stream=self.stream):
            logits = self.model.decode(self.input_ids[:bs], meta, capturing=True)
            torch.argmax(logits, dim=-1, out=self.sampled[bs])
        self.graphs[bs] = (graph, logits)

    def _bucket(self, n: int) -> int:
        assert 0 < n <= self.cfg.max_bucket, "no decode graph for this batch size"  # expect: FC109
        return next(bs for bs in self.cfg.buckets if bs >= n)

    def replay(self, ids: torch.Tensor, meta: AttnMeta) -> torch.Tensor:
        bs, n = self._bucket(meta.batch_size), meta.batch_size
        if meta.kv_indptr[-1].item() > self.backend.kv_indices_buf.numel():  # expect: FC101
            raise ValueError(f"page indices overflow the bound buffer: {meta.kv_indptr}")  # ok: FC101
        self.input_ids.resize_(bs)  # expect: FC107
        self.input_ids[:n].copy_(ids)
        for name in _STATIC_INPUTS:
            setattr(self, name, getattr(meta, name).clone())  # expect: FC107
        self.backend.kv_indptr_buf[:1].zero_()  # expect: FC104
        graph, logits = self.graphs[bs]
        graph.replay()
        return logits[:n]

    def dump(self) -> Dict[int, torch.Tensor]:  # for the debugging endpoint
        return {bs: logits.cpu() for bs, (_, logits) in self.graphs.items()}  # ok: FC101

@dataclass
class StepOutput:
    rids: List[int]
    tokens: List[int] = field(default_factory=list)
    logprobs: Optional[torch.Tensor] = None

def _pad_tail(indptr: torch.Tensor, n: int, bs: int) -> None:
    indptr[n + 1 : bs + 1] = indptr[n]

class StepPipeline:
    def __init__(self, cfg: HybridConfig, device: torch.device, eos_id: int = 0):
        self.cfg, self.device, self.eos_id = cfg, device, eos_id
        self.backend = HybridAttnBackend(cfg, device)
        self.cache = RecurrentStateCache(cfg.num_layers - cfg.num_layers // cfg.attn_every, cfg.max_batch, cfg.num_qo_heads,
                                         cfg.head_dim, device)
        self.model = HybridModel(cfg, self.backend, self.cache, device).to(device)
        self.graphs = DecodeGraphs(cfg, self.model, self.backend, device)
        self.sched = Scheduler(cfg.max_pages, cfg.max_batch, cfg.max_batch)
        self.next_ids = torch.zeros(cfg.max_batch, dtype=torch.int64, device=device)
        self.done_flags = torch.zeros(cfg.max_batch, dtype=torch.int32, device=device)
        self.logprob_buf = torch.zeros(cfg.max_batch, device=device)
        self.last_logits: Optional[torch.Tensor] = None
        self._slot_ids: Optional[torch.Tensor] = None
        self.tok_mirror = torch.zeros(cfg.max_batch, dtype=torch.int64, pin_memory=True)
        self.first_mirror = torch.zeros(cfg.max_batch, dtype=torch.int64, pin_memory=True)
        self.lp_mirror = torch.zeros(cfg.max_batch, pin_memory=True)
        self.prev_event, self.prev_rids, self._rids = torch.cuda.Event(), [], itertools.count()

    def submit(self, prompts: List[List[int]], max_new_tokens: int) -> None:
        assert all(len(p) <= self.cfg.max_tokens for p in prompts), "prompt longer than a step"  # expect: FC109
        for p in prompts:
            self.sched.add_request(Request(next(self._rids), list(p), max_new_tokens))

    def abort(self, rid: int) -> None:
        self.sched.finish(rid)
        self.backend.kv_indices_buf.zero_()  # expect: FC104

    def _ids_for(self, reqs: List[Request], prefill: bool) -> torch.Tensor:
        if not prefill:
            return self.next_ids[: len(reqs)].clone()
        ids = np.concatenate([np.asarray(r.prompt, dtype=np.int64) for r in reqs])
        return torch.from_numpy(np.pad(ids, (0, (-len(ids)) % 8))).to(self.device, non_blocking=True)

    def start(self) -> None:
        self.backend.warm_up()
        self.graphs.capture_all()

    def schedule_stage(self) -> Generator[Optional[StepPlan], None, None]:
        while True:
            if self._slot_ids is None:
                self._slot_ids = torch.arange(self.cfg.max_batch, device=self.device)  # ok: FC107
            if sum(self.done_flags) > 0:  # expect: FC101
                done = self._slot_ids[self.done_flags > 0]  # expect: FC101
                self.cache.wkv[:, done], self.cache.shift[:, done] = 0.0, 0.0
                self.done_flags.zero_()
            plan = self.sched.next_plan(self._ids_for)
            if not plan.rids:  # ok: FC101
                yield None
                continue
            self.cache.grow(max(plan.slots) + 1)  # ok: FC101
            yield plan

    def prepare_stage(self) -> Generator[Optional[AttnMeta], StepPlan, None]:
        plan = yield None
        while True:
            assert plan is not None, "the driver sends a plan every step"  # ok: FC109
            meta: AttnMeta = build_attn_meta(plan, self.device)
            meta = meta._replace(max_len=meta.seq_lens.max())  # the trtllm kernels take the max on the device
            logger.debug(f"step of {meta.batch_size} rows, lengths {meta.seq_lens}")  # expect: FC101
            logger.debug(f"prompt lengths {plan.ext_lens_np.tolist()}, host lengths {meta.seq_lens_cpu.numpy()}")  # ok: FC101
            if int(meta.max_len) > self.cfg.long_context:  # expect: FC101
                meta = meta._replace(mode="long")  # ok: FC103
            bs = self.graphs.bucket_for(meta.batch_size)
            if meta.is_decode and meta.mode != "long" and bs is not None:  # ok: FC101
                n = meta.batch_size
                meta = meta._replace(seq_lens=torch.cat([meta.seq_lens, meta.seq_lens.new_ones(bs - n)]))  # ok: FC107
                meta = self.backend.plan_bucket(meta, bs)
                self.graphs.state_slots[:n].copy_(meta.state_slots)  # ok: FC104
                _pad_tail(meta.kv_indptr, n, bs)  # expect: FC104
            elif meta.is_decode:
                self.backend.plan_eager_decode(meta)
            elif meta.mode == "long":
                self.backend.plan_long(meta)
            elif meta.num_pages > int(plan.ext_lens_np.sum()) // PAGE_SIZE + meta.batch_size:  # ok: FC101
                meta = meta._replace(mode="paged")  # resumed prompts attend pages written before: paged prefill
                self.backend.plan_prefill(meta)
            else:
                self.backend.plan_ragged(meta)
            plan = yield meta

    def run_stage(self) -> Generator[Optional[torch.Tensor], Tuple[StepPlan, AttnMeta], None]:
        logits: Optional[torch.Tensor] = None
        while True:
            plan, meta = yield logits
            if meta.mode == "graph":
                logits = self.graphs.replay(plan.input_ids, meta)
                meta.last_page_len.remainder_(PAGE_SIZE).add_(1)  # expect: FC104
            elif meta.is_decode:
                logits = self.model.decode(plan.input_ids, meta, capturing=False)
            else:
                logits = self.model.prefill(plan.input_ids[: meta.qo_indptr[-1]], meta)  # expect: FC101
            self.last_logits = logits.clone()  # expect: FC107
            torch.cuda.synchronize()  # expect: FC101

    def sample_stage(self) -> Generator[Optional[StepOutput], Tuple[StepPlan, torch.Tensor], None]:
        out: Optional[StepOutput] = None
        while True:
            plan, logits = yield out
            n, probs = len(plan.rids), torch.softmax(logits.float(), dim=-1)
            next_ids = torch.where(probs.amax(dim=-1) > 0.9, probs.argmax(dim=-1), torch.multinomial(probs, 1).squeeze(1))  # ok: FC101
            self.next_ids[:n].copy_(next_ids)
            if self.logprob_buf.numel() < n:
                self.logprob_buf = torch.empty(n, device=self.device)  # expect: FC107
            torch.log(probs.gather(1, next_ids[:, None]).squeeze(1), out=self.logprob_buf[:n])
            eos_rows = torch.nonzero(next_ids == self.eos_id).squeeze(1)  # expect: FC101
            self.done_flags.index_fill_(0, eos_rows, 1)
            self.backend.last_page_buf.index_fill_(0, eos_rows, 1)  # expect: FC104
            for r in eos_rows.tolist():  # expect: FC101
                self.sched.finish(plan.rids[r])
            if plan.is_decode:  # overlap: emit the previous step's tokens once their copy has landed
                ready = self.prev_rids and self.prev_event.query()  # ok: FC101
                out = StepOutput(self.prev_rids, self.tok_mirror[: len(self.prev_rids)].tolist()) if ready else None  # ok: FC101
                self.tok_mirror[:n].copy_(next_ids, non_blocking=True)  # ok: FC101
                self.prev_event.record()
                self.prev_rids = plan.rids
            else:  # the first token of a new prompt goes out at once
                if n > self.first_mirror.numel():
                    self.first_mirror = torch.empty(n, dtype=torch.int64, pin_memory=True)  # ok: FC107
                self.first_mirror[:n].copy_(next_ids, non_blocking=True)
                out = StepOutput(plan.rids, self.first_mirror[:n].tolist())  # expect: FC101
            if out is not None:
                self.lp_mirror[:n].copy_(self.logprob_buf[:n])  # expect: FC101
                out.logprobs = self.logprob_buf[:n].clone()  # ok: FC107

    def drive(self, steps: int) -> Iterator[StepOutput]:
        assert self.graphs.graphs, "call start() before driving the pipeline"  # ok: FC109
        sched, prep, run, samp = self.schedule_stage(), self.prepare_stage(), self.run_stage(), self.sample_stage()
        for stage in (prep, run, samp):
            next(stage)  # prime each coroutine up to its first `yield`
        for _ in range(steps):
            plan = next(sched)
            if plan is None:
                continue
            meta = prep.send(plan)
            logits = run.send((plan, meta))
            out = samp.send((plan, logits))
            if out is not None:
                for rid, tok in zip(out.rids, out.tokens):
                    if rid in self.sched.running:
                        self.sched.running[rid].output.append(tok)
                yield out
