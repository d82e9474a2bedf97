import torch

from beamserve.beam_state import BeamTable
from beamserve.pages import PagePool


def test_set_width_updates_host_mirror():
    table = BeamTable(4, 8, torch.device("cpu"))
    table.set_width(1, 4)
    assert table.max_width_host == 4  # ok: FC109


def test_fork_shares_prefix():
    pool = PagePool(64, 16, 4, torch.device("cpu"))
    parent = pool.alloc(3)
    children = pool.fork(parent, 2)
    assert all(c[:2] == parent[:2] for c in children)
    assert pool.refcount_np[parent[0]] == 3
