"""Placement and balancing plan on the host."""

import numpy as np

from eplb.placement import ExpertPlacement, create_balance_plan


def test_initial_placement_covers_every_expert():
    p = ExpertPlacement(num_logical=8, num_physical=12, ep_size=4)
    assert sorted(set(p.phy2log.tolist())) == list(range(8))
    assert p.log2phy_np.min() >= 0


def test_hot_expert_gets_the_replicas():
    p = ExpertPlacement(num_logical=4, num_physical=8, ep_size=2)
    load = np.zeros((3, 8), dtype=np.int64)
    load[:, p.log2phy_np[2]] = 1000
    load[:, p.log2phy_np[0]] = 10
    plan = create_balance_plan(load, p)
    assert (plan == 2).sum() >= 3
    assert set(plan.tolist()) == {0, 1, 2, 3}


def test_update_reports_moved_slots():
    p = ExpertPlacement(num_logical=4, num_physical=4, ep_size=2)
    new = p.phy2log[::-1].copy()
    moved = p.update(new)
    assert moved.tolist() == [0, 1, 2, 3]
    assert p.version == 1
