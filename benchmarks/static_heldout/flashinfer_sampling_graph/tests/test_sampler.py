import torch

from fsample import expand_rows, seeded_uniform


def test_expand_rows_repeats_per_request_values():
    vals = torch.tensor([0.5, 1.0, 0.7])
    counts = torch.tensor([2, 1, 3])
    rows = expand_rows(vals, counts, 6)
    assert rows.tolist() == [0.5, 0.5, 1.0, 0.7, 0.7, 0.7]  # ok: FC109


def test_seeded_uniform_is_reproducible():
    seeds = torch.tensor([7, 7, 11])
    offsets = torch.tensor([3, 3, 3])
    u = seeded_uniform(seeds, offsets, 32)
    assert torch.equal(u[0], u[1]) and not torch.equal(u[0], u[2])
    assert bool(((u > 0) & (u < 1)).all())
