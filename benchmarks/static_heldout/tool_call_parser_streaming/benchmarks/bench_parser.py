"""Parser throughput and a trtllm-gen decode micro-benchmark."""
import time

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from toolstream import StreamingToolParser

_CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2, 3]}}</tool_call>'


def bench_parser(n: int = 2000) -> float:
    text = ("Let me check. " + _CALL) * 4
    start = time.perf_counter()
    total = 0
    for _ in range(n):
        p = StreamingToolParser()
        for i in range(0, len(text), 7):
            total += len(p.feed(text[i : i + 7]))
    assert total > 0  # ok: FC109
    return n / (time.perf_counter() - start)


def bench_trtllm_decode(bs: int = 64, pages_per_seq: int = 32) -> float:
    workspace = torch.zeros(128 * 1024 * 1024, dtype=torch.uint8, device="cuda")  # ok: FC105
    w = BatchDecodeWithPagedKVCacheWrapper(workspace, "HND", backend="trtllm-gen")
    indptr = torch.arange(bs + 1, dtype=torch.int32) * pages_per_seq
    w.plan(indptr, torch.arange(bs * pages_per_seq, dtype=torch.int32, device="cuda"),
           torch.full((bs,), 16, dtype=torch.int32), 32, 8, 128, 16)
    q = torch.randn(bs, 32, 128, dtype=torch.bfloat16, device="cuda")
    kv = torch.randn(bs * pages_per_seq, 2, 8, 16, 128, dtype=torch.bfloat16, device="cuda")
    out = w.run(q, kv)
    checksum = out.float().sum().item()  # ok: FC101
    return checksum


if __name__ == "__main__":
    print(f"parser: {bench_parser():.0f} streams/s, decode checksum {bench_trtllm_decode():.3f}")
