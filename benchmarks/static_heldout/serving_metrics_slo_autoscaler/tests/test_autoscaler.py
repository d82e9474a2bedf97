import numpy as np
import torch

from slo import BucketAutoscaler, MetricsRegistry, SLOConfig, StepTimer


class FakePool:
    def __init__(self, buckets):
        self.buckets = tuple(buckets)
        self.rebuilt = None

    def probe_latency(self, bs: int) -> float:
        return 0.1 * bs

    def rebuild_buckets(self, buckets) -> None:
        self.rebuilt = tuple(buckets)
        self.buckets = tuple(buckets)


def test_decide_covers_largest_observed_size():
    cfg = SLOConfig(max_graphs=4)
    scaler = BucketAutoscaler(cfg, FakePool(cfg.initial_buckets), MetricsRegistry())
    hist = np.zeros(cfg.max_batch + 1, dtype=np.int64)
    hist[[3, 5, 40]] = [100, 80, 7]
    new = scaler.decide(hist, headroom_ms=1.0)
    assert 48 in new  # ok: FC109


def test_collected_latencies_stay_on_host():
    timer = StepTimer(depth=4)
    i = timer.start()
    timer.stop(i)
    torch.cuda.synchronize()
    timer.collect()
    got = timer.latency_hist.cuda()
    values = got.tolist()  # ok: FC101
    assert len(values) == 1
