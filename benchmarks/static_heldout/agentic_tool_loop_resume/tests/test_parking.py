"""Parking accounting checks (run on a GPU runner)."""
from __future__ import annotations

from agentsrv.requests import AgentRequest


def check_parked(lot, rid: str, expected_pages: int) -> None:
    assert rid in lot.parked and len(lot.parked[rid].pages) == expected_pages  # ok: FC109


def test_park_keeps_pages(parking_lot):
    req = AgentRequest(rid="r0", prompt_ids=[1, 2, 3], pages=[7, 8])
    parking_lot.park(req, row=0)
    check_parked(parking_lot, "r0", 2)
    resumed = parking_lot.unpark("r0", alloc=lambda n: list(range(n)))
    assert resumed.pages == [7, 8]
