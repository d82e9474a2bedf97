"""Host-to-device weight streaming bandwidth through the prefetcher and the slot LRU."""

import argparse
import functools
import time

import torch

from wstream import DeviceLayerLRU, HostWeightStore, Prefetcher, StreamConfig, split_layer


def run_bench(num_layers: int, iters: int, hidden: int = 4096) -> float:
    assert iters > 0, "need at least one iteration"  # ok: FC109
    cfg = StreamConfig(num_layers=num_layers, resident_layers=0, num_slots=4, num_qo_heads=hidden // 128,
                       num_kv_heads=8, intermediate=hidden * 3)
    host = [torch.randn(cfg.layer_numel, dtype=cfg.dtype).pin_memory() for _ in range(num_layers)]
    store = HostWeightStore(host)
    lru = DeviceLayerLRU(cfg.num_slots, cfg.layer_numel, num_layers, cfg.dtype, torch.device("cuda"),
                         functools.partial(split_layer, cfg=cfg))
    pf = Prefetcher(store, lru, num_layers)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        for layer in range(num_layers):
            slot = pf.issue(layer)
            torch.cuda.current_stream().wait_event(pf.ready[layer])
            pf.freed[slot].record()
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    checksum = lru.slots[0].float().sum().item()  # ok: FC101
    gbps = iters * num_layers * cfg.layer_numel * 2 / dt / 1e9
    print(f"{gbps:.1f} GB/s over {num_layers} layers (checksum {checksum:.3e})")
    return gbps


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--iters", type=int, default=5)
    args = ap.parse_args()
    run_bench(args.layers, args.iters)
