"""Steps per second of the generator pipeline on a synthetic decode load."""

import time

import torch

from genserve import Engine, EngineConfig
from genserve.batch import Request


def bench_decode(steps: int = 200, batch: int = 32) -> float:
    engine = Engine(EngineConfig())
    engine.warmup()
    for rid in range(batch):
        engine.submit(Request(rid=rid, prompt_ids=list(range(128)), max_new_tokens=steps + 1))
    engine.drive_step()  # the prefill
    torch.cuda.synchronize()  # ok: FC101
    start = time.perf_counter()
    for _ in range(steps):
        engine.drive_step()
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    planned = engine.backend.decode_wrapper._plan_info  # ok: FC103
    print(f"{steps / elapsed:.1f} steps/s, decode plan cached: {planned is not None}")
    engine.backend.kv_indptr.zero_()  # ok: FC104
    return steps / elapsed


if __name__ == "__main__":
    bench_decode()
