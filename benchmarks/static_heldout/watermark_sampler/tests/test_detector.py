import torch

from wmserve.watermark.greenlist import GreenListBias, GreenListTable
from wmserve.config import WatermarkConfig


def assert_green_fraction(table: GreenListTable, bucket: int, gamma: float) -> None:
    frac = table.bits[bucket].float().mean().item()
    assert abs(frac - gamma) < 1e-3  # ok: FC109


def test_tables_pack_roundtrip():
    cfg = WatermarkConfig(num_buckets=8)
    table = GreenListTable(1000, cfg.gamma, cfg.num_buckets, cfg.hash_key, torch.device("cpu"))
    for b in range(8):
        assert_green_fraction(table, b, cfg.gamma)
    mask = table.green_mask(torch.arange(8))
    assert torch.equal(mask, table.bits)
    GreenListBias(cfg, table, torch.device("cpu"))
