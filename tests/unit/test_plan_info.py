"""FC304 plan-info-stable: quiet when a re-plan yields the captured plan_info, one finding naming the first differing
entry otherwise (including a length change, which the Driver sees when a wrapper's schedule grows)."""

from __future__ import annotations

import numpy as np

from flashcheck.findings import Location
from flashcheck.properties.plan_info import PLAN_INFO_STABLE, check_plan_info

PLAN_INFO_ID, PLAN_INFO_NAME = PLAN_INFO_STABLE.id, PLAN_INFO_STABLE.name


def test_the_same_plan_info_is_quiet_whatever_its_container() -> None:
    assert check_plan_info([1, 0, 128, 4096], [1, 0, 128, 4096], bucket=8) == []
    assert check_plan_info(np.array([1, 0, 128]), (1, 0, 128), bucket=8) == []
    assert check_plan_info([], [], bucket=1) == []


def test_a_changed_entry_is_one_finding_naming_the_first_difference() -> None:
    where = Location(target="mla-fa2", step=7, region="prepare_replay")
    (f,) = check_plan_info([1, 0, 128, 7], [2, 0, 256, 7], bucket=16, location=where)
    assert (f.id, f.name, f.kind, f.location) == (PLAN_INFO_ID, PLAN_INFO_NAME, "property", where)
    assert f.message == "graph bs=16: plan_info[0] is 2 after re-plan, 1 at capture"
    assert f.evidence == {"check": "plan-info", "bucket": 16, "index": 0, "captured": [1, 0, 128, 7],
                          "current": [2, 0, 256, 7]}  # fmt: skip
    assert f.hint
    (last,) = check_plan_info([1, 0, 128, 7], [1, 0, 128, 8], bucket=4)
    assert last.evidence["index"] == 3 and "plan_info[3] is 8 after re-plan, 7 at capture" in last.message


def test_a_length_change_is_a_finding_at_the_first_missing_entry() -> None:
    (longer,) = check_plan_info([1, 0], [1, 0, 5], bucket=2)
    assert longer.evidence["index"] == 2 and "plan_info[2] is 5 after re-plan, None at capture" in longer.message
    (shorter,) = check_plan_info([1, 0, 5], [1, 0], bucket=2)
    assert shorter.evidence["index"] == 2 and "plan_info[2] is None after re-plan, 5 at capture" in shorter.message
    assert check_plan_info([1, 0, 5], [1, 0], bucket=2)[0].location == Location()
