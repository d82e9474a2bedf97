"""The scheduler-side runner: shards each step over the worker pool and collects the sampled tokens."""

from __future__ import annotations

import logging
import queue
import threading
from typing import Callable, ClassVar, Dict, List, Optional, Sequence, Tuple

import torch

from stl_attn.kv_pool import KVCompactor
from stlserve.batch import ForwardMode, Request
from stlserve.config import EngineConfig
from stlserve.workspace import WorkspaceManager
from stlserve.worker import DecodeWorker, StepOutput, WorkerPool
from stlserve.wrappers import WrapperCache

logger = logging.getLogger(__name__)

TokenSink = Callable[[int, int], None]


class ModelRunner:
    _instance: ClassVar[Optional["ModelRunner"]] = None
    _lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def get_instance(cls) -> "ModelRunner":
        if cls._instance is None:
            with cls._lock:
                if cls._instance is None:
                    cls._instance = cls(EngineConfig.get_instance())
        return cls._instance

    def __init__(self, cfg: EngineConfig) -> None:
        self.cfg = cfg
        # first construction of the workspace singleton: later WorkspaceManager() calls take no arguments
        self.workspaces = WorkspaceManager(cfg)
        self.pool = WorkerPool.get_instance()
        self._sinks: List[TokenSink] = []
        self._out_queue: "queue.Queue[Optional[StepOutput]]" = queue.Queue()
        self._defrag_queue: "queue.Queue[Optional[Tuple[torch.device, List[Tuple[int, int]]]]]" = queue.Queue()
        self._output_thread = threading.Thread(target=self._output_loop, name="stl-output", daemon=True)
        self._defrag_thread = threading.Thread(target=self._defrag_loop, name="stl-defrag", daemon=True)
        self._output_thread.start()
        self._defrag_thread.start()
        self.steps = 0

    def add_sink(self, sink: TokenSink) -> None:
        self._sinks.append(sink)

    # -- start-up -------------------------------------------------------------------------------------------------

    def initialize(self) -> Dict[str, int]:
        kv_bytes = self.profile_run()
        recorded = self.pool.warm_up()
        return {"kv_bytes": kv_bytes, "graphs": recorded}

    def profile_run(self) -> int:
        """Bytes left for the KV pool after weights and workspaces."""
        torch.cuda.synchronize()  # ok: FC101
        free, total = torch.cuda.mem_get_info()
        reserved = self.workspaces.total_bytes() + WrapperCache.workspace_bytes()
        logger.info("free %d of %d bytes, %d held by workspaces", free, total, reserved)
        return max(0, free - reserved - (2 << 30))

    # -- per step ----------------------------------------------------------------------------------------------

    def _shard(self, reqs: Sequence[Request]) -> List[List[Request]]:
        shards: List[List[Request]] = [[] for _ in range(self.cfg.num_workers)]
        for r in reqs:
            shards[r.rid % self.cfg.num_workers].append(r)
        return [s for s in shards if s]

    def step(self, reqs: Sequence[Request], mode: ForwardMode) -> None:
        self.steps += 1
        futures = [self.pool.executor.submit(DecodeWorker.run_on_thread, shard, mode) for shard in self._shard(reqs)]
        for fut in futures:
            out = fut.result()
            if mode == ForwardMode.EXTEND:
                self._emit(out.req_ids, out.next_ids.tolist())  # expect: FC101
            else:
                self._out_queue.put(out)

    def _emit(self, req_ids: Sequence[int], token_ids: Sequence[int]) -> None:
        for rid, tok in zip(req_ids, token_ids):
            for sink in self._sinks:
                sink(rid, tok)

    def request_compaction(self, device: torch.device, moves: List[Tuple[int, int]]) -> None:
        self._defrag_queue.put((device, moves))

    # -- background threads --------------------------------------------------------------------------------------

    def _output_loop(self) -> None:
        while True:
            out = self._out_queue.get()
            if out is None:
                return
            out.done.synchronize()  # ok: FC101
            self._emit(out.req_ids, out.next_ids_host[: len(out.req_ids)].tolist())

    def _defrag_loop(self) -> None:
        compactor = KVCompactor.get_instance()
        while True:
            item = self._defrag_queue.get()
            if item is None:
                return
            device, moves = item
            moved = compactor.compact(device, moves)
            logger.debug("compacted %d pages on %s", moved, device)

    def shutdown(self) -> None:
        assert self._output_thread.is_alive(), "output thread died before shutdown"  # ok: FC109
        self._out_queue.put(None)
        self._defrag_queue.put(None)
        self._output_thread.join()
        self._defrag_thread.join()
        self.pool.shutdown()
        with ModelRunner._lock:
            ModelRunner._instance = None
