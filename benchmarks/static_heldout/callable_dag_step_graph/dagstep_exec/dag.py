"""The step as a DAG of named stages, ordered once and run in topological order every step."""

from collections import deque
from typing import Dict, List, Mapping, Tuple

class StepGraph:
    def __init__(self, deps: Mapping[str, Tuple[str, ...]]):
        for name, parents in deps.items():
            assert all(p in deps for p in parents), f"unknown parent of {name}"  # expect: FC109
        self.deps: Dict[str, Tuple[str, ...]] = dict(deps)
        self.order: List[str] = self._toposort()

    def _toposort(self) -> List[str]:
        indeg = {n: len(p) for n, p in self.deps.items()}
        children: Dict[str, List[str]] = {n: [] for n in self.deps}
        for n, parents in self.deps.items():
            for p in parents:
                children[p].append(n)
        ready = deque(sorted(n for n, d in indeg.items() if d == 0))
        order: List[str] = []
        while ready:
            n = ready.popleft()
            order.append(n)
            for c in children[n]:
                indeg[c] -= 1
                if indeg[c] == 0:
                    ready.append(c)
        assert len(order) == len(self.deps), "cycle in the step graph"  # ok: FC109
        return order

