"""Bucket arithmetic of the relative-position bias, against T5's reference values."""
import torch

from t5srv.kernels.t5_kernels import RelBiasTable, relative_position_bucket


def check_table(table: RelBiasTable, num_buckets: int) -> None:
    assert table.num_buckets == num_buckets  # ok: FC109


def test_bidirectional_buckets_are_symmetric_around_zero():
    rel = torch.arange(-5, 6, device="cuda")
    buckets = relative_position_bucket(rel, True, 32, 128)
    zero = buckets[5].item()  # ok: FC101
    assert zero == 0
    assert torch.equal(buckets[:5] - 16, buckets[6:].flip(0))


def test_table_lut_covers_decoder_distances():
    table = RelBiasTable(32, 128, num_heads=4, max_len=64, bidirectional=False, device=torch.device("cuda"))
    check_table(table, 32)
    assert table.bucket_lut.numel() == 64
