"""The engine: CUDA graphs per (device, bucket), one worker thread per GPU, and the coordinator over them."""

import logging
import queue
import threading
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch
from flashcheck import hot_path

from dpserve import PAGE_SIZE, DeviceBatch, DPConfig, Request, StepResult, build_device_batch
from dp_attn.wrapper_pool import WrapperPool
from dp_runtime.model import DecoderModel, sample

logger = logging.getLogger(__name__)

@dataclass
class GraphEntry:
    graph: torch.cuda.CUDAGraph
    input_ids: torch.Tensor
    logits: torch.Tensor

class DeviceGraphPool:
    def __init__(self, cfg: DPConfig, pool: WrapperPool, model: DecoderModel):
        self.cfg, self.pool, self.model = cfg, pool, model
        self.graphs: Dict[Tuple[int, int], GraphEntry] = {}
        self.out_tokens: Dict[Tuple[int, int], torch.Tensor] = {}
        self.streams = {d: torch.cuda.Stream(device=d) for d in pool.devices}
        self.mempools = {d: torch.cuda.graph_pool_handle() for d in pool.devices}

    def bucket_for(self, n: int) -> Optional[int]:
        return next((bs for bs in self.cfg.graph_buckets if bs >= n), None)

    def capture_all(self) -> None:
        assert not self.graphs, "graphs were already captured"  # ok: FC109
        self.pool.init_graph_wrappers()
        for dev in self.pool.devices:
            with torch.cuda.device(dev), torch.cuda.stream(self.streams[dev]):
                for bs in sorted(self.cfg.graph_buckets, reverse=True):
                    self.capture_one_batch_size(dev, bs)
            self.streams[dev].synchronize()  # ok: FC101
            self.pool.kv_indices_buf[dev].zero_()  # expect: FC104

    def capture_one_batch_size(self, dev: int, bs: int) -> None:
        with torch.cuda.device(dev):
            input_ids = torch.zeros(bs, dtype=torch.int64, device="cuda")
            self.out_tokens[(dev, bs)] = torch.empty(bs, dtype=torch.int64, device="cuda")  # ok: FC107
        self.pool.plan_dummy_bucket(dev, bs)
        for _ in range(2):
            self.model.forward_decode(dev, bs, input_ids, capturing=True)
        torch.cuda.synchronize(dev)  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempools[dev], stream=self.streams[dev]):
            logits = self.model.forward_decode(dev, bs, input_ids, capturing=True)
            torch.argmax(logits, dim=-1, out=self.out_tokens[(dev, bs)])
        self.graphs[(dev, bs)] = GraphEntry(graph, input_ids, logits)

    def replay(self, dev: int, batch: DeviceBatch) -> Tuple[torch.Tensor, torch.Tensor]:
        n = batch.batch_size
        assert n <= self.cfg.max_bucket, f"{n} rows have no graph"  # expect: FC109
        bs = self.bucket_for(n)
        entry = self.graphs[(dev, bs)]
        logger.debug(f"cuda:{dev} replay bs={bs} seq_lens={batch.seq_lens}")  # expect: FC101
        if n < bs:
            entry.input_ids = torch.cat([batch.input_ids, entry.input_ids.new_zeros(bs - n)])  # expect: FC107
        else:
            entry.input_ids.copy_(batch.input_ids)
        self.pool.plan_bucket(dev, bs, batch)
        self.pool.last_page_buf[dev][n:bs] = 1  # expect: FC104
        entry.graph.replay()
        return entry.logits[:n], self.out_tokens[(dev, bs)][:n]

class DeviceWorker(threading.Thread):
    def __init__(self, dev: int, cfg: DPConfig, pool: WrapperPool, model: DecoderModel, graphs: DeviceGraphPool,
                 outbox: "queue.Queue[StepResult]"):
        super().__init__(name=f"dp-worker-{dev}", daemon=True)
        self.dev, self.cfg, self.pool, self.model, self.graphs, self.outbox = dev, cfg, pool, model, graphs, outbox
        self.device = torch.device("cuda", dev)
        self.inbox: "queue.Queue[Optional[DeviceBatch]]" = queue.Queue()
        self._backend = "graph" if cfg.use_graphs else "eager"
        self._row_ids: Optional[torch.Tensor] = None
        self.stream = torch.cuda.Stream(device=dev)
        self.token_history = torch.zeros(0, dtype=torch.int64, device=self.device)
        self.last_ids = torch.zeros(cfg.max_running_per_device, dtype=torch.int64, device=self.device)
        self.tokens_host = torch.zeros(cfg.max_running_per_device, dtype=torch.int64, pin_memory=True)
        self.prefill_tokens = 0

    def run(self) -> None:
        torch.cuda.set_device(self.dev)
        while (batch := self.inbox.get()) is not None:
            assert batch.dev == self.dev, "batch routed to the wrong worker"  # ok: FC109
            try:
                with torch.cuda.stream(self.stream):
                    res = self.step(batch)
                    res.event.record(self.stream)
                res.event.synchronize()  # ok: FC101
            except RuntimeError:
                logger.exception("step failed on cuda:%d; falling back to eager decode", self.dev)
                self.pool.disable_graphs(self.dev)
                self.pool.last_page_buf[self.dev].fill_(1)  # expect: FC104
                self._backend = "eager"  # ok: FC103
                res = StepResult(self.dev, [], self.tokens_host, self.device)
            self.outbox.put(res)

    @hot_path
    def step(self, batch: DeviceBatch) -> StepResult:
        if not batch.is_prefill:
            return self.step_decode(batch)
        return self.step_long(batch) if batch.num_tokens > self.cfg.long_prompt_tokens else self.step_prefill(batch)

    def step_prefill(self, batch: DeviceBatch) -> StepResult:
        self.pool.init_forward_metadata(self.dev, batch)
        self.prefill_tokens += batch.qo_indptr[-1].item()  # expect: FC101
        next_ids = sample(self.model.forward_extend(self.dev, batch), batch.temperatures)
        if batch.batch_size > self.tokens_host.numel():
            self.tokens_host = torch.zeros(batch.batch_size, dtype=torch.int64, pin_memory=True)  # ok: FC107
        self.tokens_host[: batch.batch_size].copy_(next_ids)  # expect: FC101
        return StepResult(self.dev, batch.rids, self.tokens_host, self.device)

    def step_long(self, batch: DeviceBatch) -> StepResult:
        self.prefill_tokens += int(batch.seq_lens.sum())  # expect: FC101
        logger.info(f"cuda:{self.dev} long prefill, lengths {batch.seq_lens_cpu.tolist()}")  # ok: FC101
        next_ids = sample(self.model.forward_long(self.dev, batch), batch.temperatures)
        self.last_ids = next_ids.clone()  # expect: FC107
        self.stream.synchronize()  # expect: FC101
        self.tokens_host[: batch.batch_size].copy_(next_ids, non_blocking=True)
        return StepResult(self.dev, batch.rids, self.tokens_host, self.device)

    def step_decode(self, batch: DeviceBatch) -> StepResult:
        n, bs = batch.batch_size, self.graphs.bucket_for(batch.batch_size)
        graph_ok = bs is not None and not self.pool.needs_overflow(batch) and self.pool.can_replay(self.dev, bs)
        if self._backend == "graph" and graph_ok:
            logits, _ = self.graphs.replay(self.dev, batch)
        else:
            self.pool.init_forward_metadata(self.dev, batch)
            self.pool.seq_lens_buf[self.dev] = batch.seq_lens.clone()  # expect: FC107
            logits = self.model.forward_decode(self.dev, n, batch.input_ids, capturing=False)
        next_ids = sample(logits, batch.temperatures)
        self.tokens_host[:n].copy_(next_ids, non_blocking=True)  # ok: FC101
        self.token_history = torch.cat([self.token_history, next_ids])  # expect: FC107
        self.pool.last_page_buf[self.dev][:n].remainder_(PAGE_SIZE).add_(1)  # expect: FC104
        res = StepResult(self.dev, batch.rids, self.tokens_host, self.device)
        res.logprobs.copy_(torch.log_softmax(logits.float(), dim=-1).gather(1, next_ids[:, None]).squeeze(1))
        if self._row_ids is None:
            self._row_ids = torch.arange(self.cfg.max_running_per_device, device=self.device)  # ok: FC107
        eos_rows = self._row_ids[:n][next_ids == self.cfg.eos_token_id]  # expect: FC101
        res.finished = [batch.rids[r] for r in eos_rows.tolist()]  # expect: FC101
        return res

class Coordinator:
    def __init__(self, cfg: DPConfig):
        assert len(cfg.device_ids) == len(set(cfg.device_ids)) > 0, "device ids must be distinct"  # expect: FC109
        self.cfg = cfg
        self.pool = WrapperPool(cfg)
        self.model = DecoderModel(cfg, self.pool)
        self.graphs = DeviceGraphPool(cfg, self.pool, self.model)
        self.outbox: "queue.Queue[StepResult]" = queue.Queue()
        self.workers = {d: DeviceWorker(d, cfg, self.pool, self.model, self.graphs, self.outbox) for d in cfg.device_ids}
        self.requests: Dict[int, Request] = {}
        self.pending: Dict[int, List[Request]] = {d: [] for d in cfg.device_ids}
        self.running: Dict[int, List[Request]] = {d: [] for d in cfg.device_ids}
        self.last_logprobs: Dict[int, torch.Tensor] = {}
        self._started = False

    def start(self) -> None:
        probes = [torch.ones(4, device=torch.device("cuda", d)).sum() for d in self.cfg.device_ids]
        if any(p.item() != 4.0 for p in probes):  # ok: FC101
            raise RuntimeError("a device failed the start-up probe")
        self.pool.warm_up_kernels()
        if self.cfg.use_graphs:
            self.graphs.capture_all()
        for w in self.workers.values():
            w.start()
        self._started = True

    def submit(self, reqs: List[Request]) -> None:
        assert all(r.max_new_tokens > 0 for r in reqs), "max_new_tokens must be positive"  # expect: FC109
        for r in sorted(reqs, key=lambda r: -len(r.prompt)):  # longest first, each to the least loaded device
            r.device = min(self.cfg.device_ids, key=lambda d: sum(q.seq_len for q in self.running[d] + self.pending[d]))
            self.requests[r.rid] = r
            self.pending[r.device].append(r)

    @hot_path
    def step(self) -> Dict[int, Tuple[int, float]]:
        assert self._started, "call start() first"  # ok: FC109
        # the previous step's KV writes must land before requests move between devices
        for dev in self.cfg.device_ids:
            torch.cuda.synchronize(dev)  # expect: FC101
        sent = 0
        for dev, worker in self.workers.items():
            prefill, reqs = bool(self.pending[dev]), self.pending[dev] or self.running[dev]
            if reqs:
                worker.inbox.put(build_device_batch(reqs, dev, worker.device, is_prefill=prefill))
                self.running[dev] += self.pending[dev]
                self.pending[dev], sent = [], sent + 1
        return self.gather(sent)

    def gather(self, n: int) -> Dict[int, Tuple[int, float]]:
        out: Dict[int, Tuple[int, float]] = {}
        for _ in range(n):
            res = self.outbox.get()
            tokens = res.tokens_host[: len(res.rids)].tolist()  # ok: FC101
            self.last_logprobs[res.dev] = res.logprobs.clone()  # ok: FC107
            logprobs = res.logprobs.cpu()  # expect: FC101
            for rid, tok, lp in zip(res.rids, tokens, logprobs.tolist()):
                self.requests[rid].output.append(tok)
                out[rid] = (tok, lp)
            for rid in res.finished:
                req = self.requests.pop(rid)
                self.running[req.device].remove(req)
        assert all(r.device in self.running for r in self.requests.values())  # ok: FC109
        return out

    def debug_snapshot(self, dev: int, live_pages: int) -> torch.Tensor:  # for the admin endpoint
        snap = self.pool.kv_indices_buf[dev].clone()
        snap[live_pages:] = -1  # ok: FC104
        return snap.cpu()  # ok: FC101
