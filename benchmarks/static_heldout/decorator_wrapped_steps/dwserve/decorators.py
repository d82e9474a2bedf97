"""Project decorators for step, metadata and plan methods (all keep the name via functools.wraps)."""
import functools
import logging
import os
import time
from collections import defaultdict
from typing import Callable, Dict

import torch

logger = logging.getLogger(__name__)
KNOWN_STAGES = ("decode", "extend", "plan", "metadata", "replay", "capture", "sample")
NAN_GUARD = os.environ.get("DWSERVE_NAN_GUARD", "0") == "1"
STEP_SECONDS: Dict[str, float] = defaultdict(float)
STEP_GAUGES: Dict[str, int] = {}

def step_timer(stage: str):
    """Adds the wall time of every call to STEP_SECONDS[stage] (exported as a counter)."""
    assert stage in KNOWN_STAGES, f"unknown stage {stage}"  # expect: FC109
    def decorate(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            torch.cuda.synchronize()  # expect: FC101
            STEP_SECONDS[stage] += time.perf_counter() - start
            return out
        return timed
    return decorate

def retry_on_oom(retries: int = 1):
    """Re-runs a step after an allocator OOM, once the engine has shrunk its scratch buffers."""
    def decorate(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def retrying(self, *args, **kwargs):
            for attempt in range(retries + 1):
                try:
                    return fn(self, *args, **kwargs)
                except torch.cuda.OutOfMemoryError:
                    if attempt == retries:
                        raise
                    logger.warning("OOM in %s (attempt %d), shrinking scratch", fn.__name__, attempt)
                    torch.cuda.empty_cache()
                    self.shrink_scratch_for_retry()
        return retrying
    return decorate

def traced(stage: str):
    """Profiler range named after the stage, plus a max-length gauge; the batch is the first argument."""
    def decorate(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def traced_call(self, batch, *args, **kwargs):
            with torch.profiler.record_function(f"dwserve.{stage}.{fn.__name__}"):
                logger.debug("%s: bs=%d seq_lens=%s", stage, batch.batch_size, batch.seq_lens)  # ok: FC101
                STEP_GAUGES[f"{stage}.max_seq_len"] = int(batch.seq_lens.max())  # expect: FC101
                return fn(self, batch, *args, **kwargs)
        return traced_call
    return decorate

def check_batch(fn: Callable) -> Callable:
    """Rejects empty batches before they reach the kernels."""
    @functools.wraps(fn)
    def checked(self, batch, *args, **kwargs):
        assert batch.batch_size > 0, "empty batch"  # expect: FC109
        return fn(self, batch, *args, **kwargs)
    return checked

def skip_unchanged_plan(fn: Callable) -> Callable:
    """Skips plan() when the wrapper already holds a plan for the same batch signature."""
    @functools.wraps(fn)
    def planner(self, wrapper, signature, *args, **kwargs):
        planned = getattr(wrapper, "_plan_info", None) is not None  # expect: FC103
        if planned and self.plan_signatures.get(id(wrapper)) == signature:
            return None
        self.plan_signatures[id(wrapper)] = signature
        return fn(self, wrapper, signature, *args, **kwargs)
    return planner

def capture_synced(fn: Callable) -> Callable:
    """Drains the device around a capture: a graph must not pick up work queued before it."""
    @functools.wraps(fn)
    def synced(*args, **kwargs):
        torch.cuda.synchronize()  # ok: FC101
        try:
            return fn(*args, **kwargs)
        finally:
            torch.cuda.synchronize()  # ok: FC101
    return synced

def instrument_forwards(cls):
    """Class decorator: wraps every forward_* method in a profiler range and a NaN guard."""
    for name, member in list(vars(cls).items()):
        if name.startswith("forward_") and callable(member):
            setattr(cls, name, _guard_forward(member))
    return cls

def _guard_forward(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def guarded(self, *args, **kwargs):
        with torch.profiler.record_function(f"model.{fn.__name__}"):
            out = fn(self, *args, **kwargs)
        if NAN_GUARD and torch.isnan(out).any():  # expect: FC101
            raise FloatingPointError(f"NaN in {fn.__qualname__}: {out}")  # ok: FC101
        return out
    return guarded
