"""Dual-batch overlap: two micro-batches run in two CPU threads, handing the GPU back and forth so that one
ubatch's all-to-all (comm stream) overlaps the other ubatch's attention and GEMMs (compute stream)."""
from __future__ import annotations

import threading
from typing import Dict, List, Optional

import torch

from vllm.forward_context import ForwardContext, override_forward_context

_THREAD_ID_TO_CONTEXT: Dict[int, int] = {}
_CURRENT_CONTEXTS: List[Optional["UBatchContext"]] = [None, None]


class UBatchContext:
    def __init__(
        self,
        id: int,
        comm_stream: torch.cuda.Stream,
        compute_stream: torch.cuda.Stream,
        forward_context: ForwardContext,
        ready_barrier: threading.Barrier,
        cpu_wait_event: threading.Event,
        cpu_signal_event: threading.Event,
        gpu_comm_done_event: torch.cuda.Event,
        gpu_compute_done_event: torch.cuda.Event,
    ):
        self.id = id
        self.comm_stream = comm_stream
        self.compute_stream = compute_stream
        self.forward_context = forward_context
        self.ready_barrier = ready_barrier
        self.cpu_wait_event = cpu_wait_event
        self.cpu_signal_event = cpu_signal_event
        self.gpu_comm_done_event = gpu_comm_done_event
        self.gpu_compute_done_event = gpu_compute_done_event
        self.current_stream = compute_stream

    def __enter__(self):
        _THREAD_ID_TO_CONTEXT[threading.get_ident()] = self.id
        _CURRENT_CONTEXTS[self.id] = self
        self.ready_barrier.wait()
        self._wait_for_turn()
        override_forward_context(self.forward_context)
        self.update_stream(self.compute_stream)
        return self

    def __exit__(self, exc_type, exc, tb):
        _CURRENT_CONTEXTS[self.id] = None
        del _THREAD_ID_TO_CONTEXT[threading.get_ident()]
        self.cpu_signal_event.set()
        return False

    def update_stream(self, stream: torch.cuda.Stream) -> None:
        self.current_stream = stream
        torch.cuda.set_stream(stream)

    def _wait_for_turn(self) -> None:
        self.cpu_wait_event.wait()  # ok: FC101
        self.cpu_wait_event.clear()

    def _cpu_yield(self) -> None:
        # let the other ubatch's thread launch its kernels, then wait until it hands the CPU back
        self.cpu_signal_event.set()
        self._wait_for_turn()
        override_forward_context(self.forward_context)

    def yield_and_switch_from_compute_to_comm(self) -> None:
        assert self.current_stream is self.compute_stream  # ok: FC109
        self.gpu_compute_done_event.record(self.compute_stream)
        self._cpu_yield()
        self.update_stream(self.comm_stream)
        self.comm_stream.wait_event(self.gpu_compute_done_event)  # ok: FC101

    def yield_and_switch_from_comm_to_compute(self) -> None:
        self.gpu_comm_done_event.record(self.comm_stream)
        self._cpu_yield()
        # the combine must have landed before this ubatch's next GEMM reads it
        self.gpu_comm_done_event.synchronize()  # expect: FC101
        self.update_stream(self.compute_stream)


def dbo_current_ubatch_id() -> int:
    return _THREAD_ID_TO_CONTEXT.get(threading.get_ident(), 0)


def dbo_enabled() -> bool:
    return threading.get_ident() in _THREAD_ID_TO_CONTEXT


def dbo_yield_and_switch_from_compute_to_comm() -> None:
    if dbo_enabled():
        ctx = _CURRENT_CONTEXTS[dbo_current_ubatch_id()]
        ctx.yield_and_switch_from_compute_to_comm()


def dbo_yield_and_switch_from_comm_to_compute() -> None:
    if dbo_enabled():
        ctx = _CURRENT_CONTEXTS[dbo_current_ubatch_id()]
        ctx.yield_and_switch_from_comm_to_compute()


def make_ubatch_contexts(
    num_micro_batches: int,
    compute_stream: torch.cuda.Stream,
    comm_stream: torch.cuda.Stream,
    forward_contexts: List[ForwardContext],
    ready_barrier: threading.Barrier,
) -> List[UBatchContext]:
    assert num_micro_batches == 2, "dual-batch overlap runs exactly two ubatches"  # expect: FC109
    cpu_events = [threading.Event() for _ in range(num_micro_batches)]
    comm_done = [torch.cuda.Event() for _ in range(num_micro_batches)]
    compute_done = [torch.cuda.Event() for _ in range(num_micro_batches)]
    return [
        UBatchContext(
            id=i,
            comm_stream=comm_stream,
            compute_stream=compute_stream,
            forward_context=forward_contexts[i],
            ready_barrier=ready_barrier,
            cpu_wait_event=cpu_events[i],
            cpu_signal_event=cpu_events[(i + 1) % num_micro_batches],
            gpu_comm_done_event=comm_done[i],
            gpu_compute_done_event=compute_done[i],
        )
        for i in range(num_micro_batches)
    ]
