"""The runner resolves placeholders, builds metadata, replays or runs eagerly, samples and starts the copy
of the sampled ids to the host without waiting; the engine schedules step N+1 while a thread drains step N."""
import logging
import queue
import threading
from typing import List, Optional, Tuple

import torch

from as_attn.backend import AsyncFlashInferBackend
from as_attn.metadata import AsyncMetadataBuilder
from asched import AsyncOutput, AsyncSchedConfig, AsyncScheduler, PlaceholderResolver, SamplerOutput, SchedulerOutput

from .graph_runner import DecodeGraphRunner
from .model import TinyDecoder

logger = logging.getLogger(__name__)


class AsyncRunner:
    def __init__(self, cfg: AsyncSchedConfig):
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self.backend = AsyncFlashInferBackend(cfg, self.device)
        self.model = TinyDecoder(cfg, self.backend).to(self.device)
        self.builder = AsyncMetadataBuilder(cfg, self.device)
        self.resolver = PlaceholderResolver(cfg.max_num_tokens, cfg.max_num_reqs, self.device)
        self.graph_runner = DecodeGraphRunner(self.model, self.backend, cfg, self.device)
        # smallest captured bucket that fits each batch size
        self._bucket_of = {n: min(b for b in cfg.graph_buckets if b >= n) for n in range(1, cfg.max_bucket + 1)}
        kv_shape = (cfg.max_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv_caches: List[torch.Tensor] = [
            torch.zeros(kv_shape, dtype=torch.bfloat16, device=self.device) for _ in range(cfg.num_layers)
        ]
        self.sampled_buf = torch.zeros(cfg.max_num_reqs, dtype=torch.int64, device=self.device)
        self.eos_buf = torch.zeros(cfg.max_num_reqs, dtype=torch.bool, device=self.device)
        self._pad_ids = torch.zeros(cfg.max_bucket, dtype=torch.int64, device=self.device)
        # two pinned buffers: the output thread reads one while the next step fills the other
        self.sampled_host = [torch.zeros(cfg.max_num_reqs, dtype=torch.int64, pin_memory=True) for _ in range(2)]
        self._flip = 0
        self.copy_stream = torch.cuda.Stream()
        self.last_output: Optional[SamplerOutput] = None

    def capture_graphs(self) -> None:
        self.graph_runner.capture_all(self.kv_caches)

    def execute_model(self, sched: SchedulerOutput) -> AsyncOutput:
        n = sched.num_reqs
        prev = self.last_output.sampled_token_ids if self.last_output is not None else self.sampled_buf
        input_ids = self.resolver.resolve(sched.token_ids_cpu, sched.placeholder_mask_cpu, sched.prev_slot_cpu, prev)
        unresolved = self.resolver.num_unresolved
        if unresolved > 0:
            logger.warning("%d placeholder ids had no sampled token", unresolved)
        meta = self.builder.build(sched)
        bs = self._bucket_of.get(n)
        if sched.num_prefill_tokens == 0 and bs is not None and not meta.has_long_rows:
            if bs > n:  # padded rows read token 0
                self.graph_runner.static_input_ids = torch.cat([input_ids, self._pad_ids[: bs - n]])  # expect: FC107
            hidden = self.graph_runner.replay(bs, input_ids, meta)
            # the next step appends its placeholder's token to each row's last page
            self.backend.last_page_len_buf[:n] += 1  # expect: FC104
        elif sched.num_prefill_tokens == 0 and bs is not None:
            self.backend.plan_long_rows(meta)
            hidden = self.model.forward_decode(input_ids, meta.positions, self.kv_caches, bs, meta)
        else:
            self.backend.plan_prefill(meta)
            hidden = self.model.forward_prefill(input_ids, meta.positions, self.kv_caches, meta)
            hidden = hidden[meta.logits_indices]
        logits = self.model.lm_head(hidden)
        self.sampled_buf[:n].copy_(torch.argmax(logits, dim=-1))
        torch.eq(self.sampled_buf[:n], self.cfg.eos_token_id, out=self.eos_buf[:n])
        self.last_output = SamplerOutput(sampled_token_ids=self.sampled_buf[:n], is_eos=self.eos_buf[:n], num_reqs=n)
        host = self.sampled_host[self._flip]
        self._flip ^= 1
        self.copy_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.copy_stream):
            host[:n].copy_(self.sampled_buf[:n], non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.copy_stream)
        return AsyncOutput(host, n, event)


class AsyncEngine:
    def __init__(self, cfg: AsyncSchedConfig):
        self.eos = cfg.eos_token_id
        self.runner = AsyncRunner(cfg)
        self.scheduler = AsyncScheduler(cfg, num_pages=cfg.max_pages)
        self.outputs: "queue.Queue[Tuple[List[str], AsyncOutput]]" = queue.Queue()
        self.output_thread = threading.Thread(target=self.drain_outputs, daemon=True)

    def start(self) -> None:
        self.runner.capture_graphs()
        self.output_thread.start()

    def drain_outputs(self) -> None:
        # output thread: waits on each step's copy event, off the step loop
        while True:
            req_ids, out = self.outputs.get()
            for rid, tok in zip(req_ids, out.get_output()):
                if tok == self.eos:
                    self.scheduler.finished_queue.put(rid)

    def step(self) -> None:
        sched = self.scheduler.schedule(self.runner.last_output)
        if sched.num_reqs:
            self.outputs.put((sched.req_ids, self.runner.execute_model(sched)))
