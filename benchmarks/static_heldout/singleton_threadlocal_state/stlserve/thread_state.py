"""Per-thread state of the worker pool.

Each worker thread owns its device binding, its CUDA stream, the batch it is running, its FlashInfer wrappers and
its graph runner. They live in one ``threading.local()`` so that code deep inside the model (attention layers,
the sampler, statistics) finds them without having them passed down; ``ThreadState`` is the only accessor.
FlashInfer wrappers keep their plan in the object, so two threads must never share one.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Optional

import torch

from stlserve.batch import ForwardBatch
from stlserve.config import EngineConfig
from stlserve.workspace import WorkspaceManager

if TYPE_CHECKING:
    from stlserve.graph_runner import ThreadGraphRunner
    from stlserve.worker import DecodeWorker
    from stlserve.wrappers import ThreadWrappers


class _WorkerLocal(threading.local):
    """Attributes start out empty in every thread that touches the object."""

    def __init__(self) -> None:
        self.device: Optional[torch.device] = None
        self.stream: Optional[torch.cuda.Stream] = None
        self.batch: Optional[ForwardBatch] = None
        self.wrappers: Optional["ThreadWrappers"] = None
        self.runner: Optional["ThreadGraphRunner"] = None
        self.worker: Optional["DecodeWorker"] = None
        self.draft_ws: Optional[torch.Tensor] = None
        self.capturing_bs: int = 0
        self.step: int = 0


_TLS = _WorkerLocal()


class ThreadState:
    """Static accessors over the calling thread's slot of ``_TLS``."""

    @staticmethod
    def bind_device(device: torch.device) -> None:
        """Pool initializer: pin the thread to a device and give it a private stream."""
        torch.cuda.set_device(device)
        _TLS.device = device
        _TLS.stream = torch.cuda.Stream(device=device)

    @staticmethod
    def device() -> torch.device:
        if _TLS.device is None:
            raise RuntimeError(f"thread {threading.current_thread().name} was not started by the WorkerPool")
        return _TLS.device

    @staticmethod
    def stream() -> torch.cuda.Stream:
        if _TLS.stream is None:
            raise RuntimeError("thread has no stream; call ThreadState.bind_device() first")
        return _TLS.stream

    # -- current batch ----------------------------------------------------------------------------------------

    @staticmethod
    def set_batch(batch: ForwardBatch) -> None:
        assert batch.batch_size > 0, "scheduler handed a worker an empty shard"  # expect: FC109
        _TLS.batch = batch
        _TLS.step += 1

    @staticmethod
    def current_batch() -> ForwardBatch:
        batch = _TLS.batch
        if batch is None:
            raise RuntimeError("no batch is bound to this thread")
        return batch

    @staticmethod
    def num_tokens() -> int:
        """Query tokens of the thread's current batch."""
        return int(ThreadState.current_batch().qo_indptr[-1])  # expect: FC101

    @staticmethod
    def num_tokens_host() -> int:
        return int(ThreadState.current_batch().qo_indptr_cpu[-1])  # ok: FC101

    # -- capture flag -----------------------------------------------------------------------------------------

    @staticmethod
    def capturing() -> int:
        """The batch size being recorded by this thread, 0 outside a capture."""
        return _TLS.capturing_bs

    @staticmethod
    def set_capturing(bs: int) -> None:
        _TLS.capturing_bs = bs

    # -- lazily built per-thread objects ----------------------------------------------------------------------

    @staticmethod
    def wrappers() -> "ThreadWrappers":
        tw = _TLS.wrappers
        if tw is None:
            from stlserve.wrappers import ThreadWrappers

            tw = ThreadWrappers(EngineConfig.get_instance(), ThreadState.device())
            _TLS.wrappers = tw
        return tw

    @staticmethod
    def graph_runner() -> "ThreadGraphRunner":
        runner = _TLS.runner
        if runner is None:
            from stlserve.graph_runner import ThreadGraphRunner

            runner = ThreadGraphRunner(EngineConfig.get_instance(), ThreadState.device())
            _TLS.runner = runner
        return runner

    @staticmethod
    def draft_workspace() -> torch.Tensor:
        """Workspace of this thread's MTP draft wrapper (trtllm-gen; one draft token per row)."""
        ws = _TLS.draft_ws
        if ws is None:
            ws = torch.empty(WorkspaceManager.DRAFT_TIER_BYTES, dtype=torch.uint8, device=ThreadState.device())  # expect: FC105, FC106
            _TLS.draft_ws = ws
        return ws

    @staticmethod
    def clear() -> None:
        """Forget everything this thread built (the pool calls it when it retires a thread)."""
        _TLS.batch = None
        _TLS.wrappers = None
        _TLS.runner = None
        _TLS.worker = None
        _TLS.draft_ws = None
