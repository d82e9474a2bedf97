import torch

from seedserve.rng import philox_uniform


def test_noise_depends_only_on_seed_and_offset():
    seeds = torch.tensor([7, 7, 11], dtype=torch.int64)
    offsets = torch.tensor([3, 3, 3], dtype=torch.int64)
    u = philox_uniform(seeds, offsets, 1000)
    assert torch.equal(u[0], u[1])  # ok: FC109
    assert not torch.equal(u[0], u[2])


def test_uniform_range():
    u = philox_uniform(torch.arange(4, dtype=torch.int64), torch.zeros(4, dtype=torch.int64), 4096)
    assert float(u.min()) > 0.0 and float(u.max()) < 1.0
