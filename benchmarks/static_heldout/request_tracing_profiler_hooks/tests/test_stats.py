import torch

from tracing import TensorStatsCollector


def test_stats_flush_reports_absmax():
    c = TensorStatsCollector(max_slots=2, flush_every=1, device=torch.device("cuda"))
    c.observe("x", torch.tensor([1.0, -3.0], device="cuda"))
    c.on_step(0)
    out = c.flush()
    assert out["x"][0] == 3.0  # ok: FC109
