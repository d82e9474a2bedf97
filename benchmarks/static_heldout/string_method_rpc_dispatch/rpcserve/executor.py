"""Executors: drive one or more workers through string-named collective RPCs."""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any, Callable

import torch

from .config import RPC_TIMEOUT_S, EngineConfig
from .rpc import WORKER_RPC_METHODS, CommandQueue, MethodAllowList, RpcError, run_method
from .worker import Worker

logger = logging.getLogger(__name__)


class Executor:
    """Base class: ``collective_rpc(method, args=..., kwargs=...)`` runs ``method`` on every worker."""

    def __init__(self, cfg: EngineConfig) -> None:
        self.cfg = cfg
        self._allow = MethodAllowList(WORKER_RPC_METHODS)
        self._init_workers()

    def _init_workers(self) -> None:
        raise NotImplementedError

    def collective_rpc(
        self,
        method: str | Callable,
        timeout: float | None = None,
        args: tuple = (),
        kwargs: dict | None = None,
        unique_reply_rank: int | None = None,
    ) -> Any:
        raise NotImplementedError

    def shutdown(self) -> None:
        self.collective_rpc("shutdown")


class UniProcExecutor(Executor):
    """One worker in the engine's own thread: run_method straight on it."""

    def _init_workers(self) -> None:
        self.driver_worker = Worker(self.cfg, rank=0, local_rank=0)
        for method in ("init_device", "load_model"):
            self.collective_rpc(method)

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None, unique_reply_rank=None):
        if isinstance(method, str):
            self._allow.check(method)
        answer = run_method(self.driver_worker, method, args, kwargs)
        return answer if unique_reply_rank is not None else [answer]


class WorkerProc:
    """A worker behind a command queue, drained by its own thread (one per GPU)."""

    def __init__(self, cfg: EngineConfig, rank: int) -> None:
        self.rank = rank
        self.worker = Worker(cfg, rank=rank, local_rank=rank)
        self.commands = CommandQueue()
        self._thread = threading.Thread(target=self.worker_busy_loop, name=f"rpcserve-worker-{rank}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def worker_busy_loop(self) -> None:
        """Drain (method, args) commands and run each on the worker by name."""
        while True:
            cmd = self.commands.get()
            try:
                result = run_method(self.worker, cmd.method, cmd.args, cmd.kwargs)
            except Exception as exc:  # reported back to the caller, never swallowed
                logger.exception("worker %d: %s failed", self.rank, cmd.method)
                result = exc
            if cmd.reply is not None:
                cmd.reply.put(result)
            if cmd.method == "shutdown":
                self.commands.close()
                return


class MultiprocExecutor(Executor):
    """One WorkerProc per rank; replies come back on per-call queues."""

    def _init_workers(self) -> None:
        self.workers = [WorkerProc(self.cfg, rank) for rank in range(self.cfg.world_size)]
        for proc in self.workers:
            proc.start()
        for method in ("init_device", "load_model"):
            self.collective_rpc(method)

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None, unique_reply_rank=None):
        if not isinstance(method, str):
            raise RpcError("MultiprocExecutor only sends methods by name")
        self._allow.check(method)
        # the arguments may hold tensors the engine thread just wrote; make them visible to the workers
        torch.cuda.current_stream().synchronize()  # expect: FC101
        replies: list[queue.Queue] = []
        for proc in self.workers:
            reply: queue.Queue = queue.Queue(maxsize=1)
            proc.commands.put(method, *args, reply=reply, **(kwargs or {}))
            replies.append(reply)
        deadline = timeout if timeout is not None else RPC_TIMEOUT_S
        results = [r.get(timeout=deadline) for r in replies]
        for rank, res in enumerate(results):
            if isinstance(res, BaseException):
                raise RpcError(f"rank {rank}: {method} failed") from res
        return results[unique_reply_rank] if unique_reply_rank is not None else results

    def shutdown(self) -> None:
        super().shutdown()
        for proc in self.workers:
            proc.join(timeout=5.0)


EXECUTORS: dict[str, type[Executor]] = {"uniproc": UniProcExecutor, "mp": MultiprocExecutor}
