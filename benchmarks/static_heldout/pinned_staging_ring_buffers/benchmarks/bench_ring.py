"""Host cost of the readback ring against a plain blocking copy."""

import time

import torch

from rs_runtime.readback import TokenReadback


def bench_readback(iters: int = 200, rows: int = 128) -> float:
    next_ids = torch.zeros(rows, dtype=torch.int64, device="cuda")
    ring = TokenReadback(3, rows)
    start = time.perf_counter()
    for _ in range(iters):
        ring.launch(next_ids)
        ring.collect()
    torch.cuda.synchronize()
    checksum = next_ids.sum().item()  # ok: FC101
    assert checksum == 0, "readback buffer was not zero"  # ok: FC109
    return (time.perf_counter() - start) / iters


if __name__ == "__main__":
    print(f"{bench_readback() * 1e6:.1f} us/step")
