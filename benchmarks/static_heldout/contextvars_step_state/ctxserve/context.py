"""Step state: the step sets these, layers, attention helpers and plan helpers read them back.

contextvars keep the overlap scheduler's two in-flight steps apart; the thread-local holds what
belongs to the worker thread (the capture flag and the host staging tensors).
"""
import contextlib
import contextvars
import threading
from typing import Dict, Iterator, Optional

import torch

from ctxserve.config import GRAPH_BUCKETS
from ctxserve.metadata import ForwardBatch, ForwardMetadata, GraphState

CURRENT_BATCH: contextvars.ContextVar[Optional[ForwardBatch]] = contextvars.ContextVar("current_batch", default=None)
CURRENT_META: contextvars.ContextVar[Optional[ForwardMetadata]] = contextvars.ContextVar("current_meta", default=None)
CURRENT_GRAPH: contextvars.ContextVar[Optional[GraphState]] = contextvars.ContextVar("current_graph", default=None)
CAPTURE_BS: contextvars.ContextVar[int] = contextvars.ContextVar("capture_bs", default=0)
_TLS = threading.local()

def current_batch() -> ForwardBatch:
    batch = CURRENT_BATCH.get()
    if batch is None:
        raise LookupError("no batch in context; run inside step_context()")
    return batch

def current_meta() -> ForwardMetadata:
    meta = CURRENT_META.get()
    assert meta is not None, "forward metadata read before init_forward_metadata()"  # ok: FC109
    return meta

def is_capturing() -> bool:
    return getattr(_TLS, "capturing", False)

def host_staging() -> Dict[str, torch.Tensor]:
    """Pinned host tensors of this worker thread, keyed by name (allocated by the model runner)."""
    if not hasattr(_TLS, "staging"):
        _TLS.staging = {}
    return _TLS.staging

@contextlib.contextmanager
def step_context(batch: ForwardBatch) -> Iterator[ForwardBatch]:
    assert batch.batch_size > 0, "empty batch"  # expect: FC109
    assert CURRENT_BATCH.get() is None, "step contexts do not nest"  # ok: FC109
    token = CURRENT_BATCH.set(batch)
    try:
        yield batch
    finally:
        CURRENT_BATCH.reset(token)

@contextlib.contextmanager
def capture_mode(state: GraphState) -> Iterator[GraphState]:
    assert state.bs in GRAPH_BUCKETS, f"bucket {state.bs} is not configured"  # expect: FC109
    _TLS.capturing = True
    bs_token, graph_token = CAPTURE_BS.set(state.bs), CURRENT_GRAPH.set(state)
    try:
        yield state
    finally:
        CURRENT_GRAPH.reset(graph_token)
        CAPTURE_BS.reset(bs_token)
        _TLS.capturing = False
