"""One GPU worker: schedule, build the step record, plan or replay, sample."""

from __future__ import annotations

import logging
import queue
import threading
from typing import Callable, Optional

import numpy as np
import torch

from .attention.flashinfer_backend import FlashInferTupleBackend
from .config import EngineConfig
from .graph_runner import BucketGraphRunner
from .kv.page_pool import PagePool
from .model import TupleLM
from .records import make_meta
from .sampler import TupleSampler
from .scheduler import Scheduler
from .slots import BATCH_SIZE, BUF_LAST_PAGE, ROW_EXTEND, ROW_RID, ROW_TOKENS

logger = logging.getLogger(__name__)

TokenSink = Callable[[int, int], None]


class ModelRunner:
    def __init__(self, cfg: EngineConfig, token_sink: Optional[TokenSink] = None):
        self.cfg = cfg
        self.device = torch.device("cuda", cfg.device_id)
        torch.cuda.set_device(self.device)
        self.pool = PagePool(cfg.num_pages, cfg.page_size)
        self.kv_caches = [
            torch.zeros(
                cfg.num_pages, 2, cfg.num_kv_heads, cfg.page_size, cfg.head_dim, dtype=cfg.dtype, device=self.device
            )
            for _ in range(cfg.num_layers)
        ]
        self.attn_backend = FlashInferTupleBackend(cfg, self.device, self.kv_caches)
        self.model = TupleLM(cfg, self.attn_backend).to(device=self.device, dtype=cfg.dtype)
        self.sampler = TupleSampler(cfg, self.device)
        self.scheduler = Scheduler(cfg, self.pool)
        self.graph_runner = BucketGraphRunner(self, list(cfg.capture_sizes))

        self.copy_stream = torch.cuda.Stream(self.device)
        self.next_ids_host = torch.empty(cfg.max_batch_size, dtype=torch.int64, pin_memory=True)
        self.token_sink = token_sink or (lambda rid, tok: None)
        self.outputs: queue.SimpleQueue = queue.SimpleQueue()
        self._out_thread = threading.Thread(target=self._drain_outputs, name="tupserve-output", daemon=True)

    def warmup(self) -> None:
        if self.cfg.enable_cuda_graph:
            self.graph_runner.capture()
        logger.info("attention memory: %s", self.attn_backend.memory_report())
        self._out_thread.start()

    def shutdown(self) -> None:
        self.outputs.put(None)
        self._out_thread.join(timeout=5.0)

    # ------------------------------------------------------------------ step

    def step(self) -> int:
        rows, params = self.scheduler.schedule()
        if not rows:
            # idle: park every captured bucket on empty rows
            for state in self.attn_backend.graph_state:
                if state is not None:
                    state[BUF_LAST_PAGE].zero_()  # expect: FC104
            return 0

        mode = "decode" if all(r[ROW_EXTEND] == 1 for r in rows) else "extend"
        meta = make_meta(rows, self.cfg.page_size, self.device, mode)
        bs = meta[BATCH_SIZE]
        input_ids = self._input_ids(rows)
        if self.graph_runner.can_run(meta):
            logits = self.graph_runner.replay(input_ids, meta)
        else:
            self.attn_backend.init_forward_metadata(meta)
            logits = self.model(input_ids, meta)
        next_ids = self.sampler(logits, params)

        rids = [r[ROW_RID] for r in rows]
        finished = [rid for rid, tok in zip(rids, next_ids) if tok == self.cfg.eos_token_id]  # expect: FC101

        if bs > self.next_ids_host.numel():
            self.next_ids_host = torch.empty(2 * bs, dtype=torch.int64, pin_memory=True)  # ok: FC107
        host = self.next_ids_host[:bs]
        done = torch.cuda.Event()
        with torch.cuda.stream(self.copy_stream):
            self.copy_stream.wait_stream(torch.cuda.current_stream())
            host.copy_(next_ids, non_blocking=True)  # ok: FC101
            done.record()
        self.scheduler.append_tokens(rids, host.tolist())  # expect: FC101
        self.scheduler.finish(finished)
        self.outputs.put((done, rids, host))

        if self.pool.fragmentation() > self.cfg.compact_threshold:
            self._compact_kv()
        return bs

    def _input_ids(self, rows: list[tuple]) -> torch.Tensor:
        flat = np.concatenate([np.asarray(r[ROW_TOKENS], dtype=np.int64) for r in rows])
        return torch.from_numpy(flat).pin_memory().to(self.device, non_blocking=True)

    def _compact_kv(self) -> None:
        src_np, dst_np = self.pool.compact(self.cfg.max_batch_size)
        if src_np.size == 0:
            return
        src = torch.from_numpy(src_np).to(self.device, non_blocking=True).long()
        dst = torch.from_numpy(dst_np).to(self.device, non_blocking=True).long()
        for cache in self.kv_caches:
            cache[dst] = cache[src]
        self.scheduler.remap_pages(dict(zip(src_np.tolist(), dst_np.tolist())))
        largest = self.graph_runner.buckets[-1]
        if self.attn_backend.graph_state[largest] is None:
            return
        # keep the captured page list consistent with the pages that just moved
        lut = torch.arange(self.cfg.num_pages, dtype=torch.int32, device=self.device)
        lut[src] = dst.int()
        _, indices, _ = self.attn_backend.graph_buffers(largest)
        indices.copy_(lut[indices.long()])  # expect: FC104

    # ---------------------------------------------------------- output thread

    def _drain_outputs(self) -> None:
        while True:
            item = self.outputs.get()
            if item is None:
                return
            done, rids, host = item
            done.synchronize()  # ok: FC101
            for rid, tok in zip(rids, host.tolist()):
                self.token_sink(rid, tok)
