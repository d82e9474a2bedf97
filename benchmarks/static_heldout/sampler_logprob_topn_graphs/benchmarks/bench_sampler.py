"""Micro-benchmark of the penalty op on random logits (run by hand, not by the server)."""

import time

import torch

from sampling import apply_penalties, min_p_filter


def bench_penalties(rows: int = 64, vocab: int = 151936, iters: int = 50) -> float:
    assert rows <= 1024, "rows beyond the largest bucket say nothing about serving"  # ok: FC109
    logits = torch.randn(rows, vocab, device="cuda")
    counts = torch.randint(0, 3, (rows, vocab), device="cuda").float()
    rep = torch.full((rows,), 1.1, device="cuda")
    freq = torch.full((rows,), 0.2, device="cuda")
    min_p = torch.full((rows,), 0.05, device="cuda")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        out = min_p_filter(apply_penalties(logits, counts, rep, freq), min_p)
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / iters
    finite = torch.isfinite(out).sum().item()  # ok: FC101
    print(f"{rows}x{vocab}: {dt * 1e6:.1f} us/iter, {finite} finite logits")
    return dt


if __name__ == "__main__":
    for r in (1, 8, 64, 128):
        bench_penalties(r)
