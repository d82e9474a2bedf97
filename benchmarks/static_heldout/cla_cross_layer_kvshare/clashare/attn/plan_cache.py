"""Skip re-planning a group whose page layout did not change since the last step."""
from __future__ import annotations

from typing import Dict, Hashable, Optional


class GroupPlanCache:
    def __init__(self) -> None:
        # the engine's own record of what it planned, keyed by group
        self._plan_info: Dict[int, Hashable] = {}
        self.hits = 0

    def same(self, group: int, key: Hashable) -> bool:
        prev: Optional[Hashable] = self._plan_info.get(group)  # ok: FC103
        if prev == key:
            self.hits += 1
            return True
        self._plan_info[group] = key
        return False

    def clear(self) -> None:
        self._plan_info.clear()
