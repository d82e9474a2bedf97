"""Layer -> KV group map for cross-layer attention."""
from __future__ import annotations

from typing import List


class LayerGroupMap:
    """Groups of ``cla_factor`` adjacent layers share one KV cache.

    Only the first layer of a group (the producer) projects and appends K/V; the
    other layers of the group read what the producer wrote in the same step.
    """

    def __init__(self, num_layers: int, cla_factor: int, local_group_every: int = 0) -> None:
        assert num_layers % cla_factor == 0, "the CLA factor must divide the layer count"  # expect: FC109
        self.num_layers = num_layers
        self.cla_factor = cla_factor
        self.num_groups = num_layers // cla_factor
        self._group_of: List[int] = [layer // cla_factor for layer in range(num_layers)]
        self._producer: List[bool] = [layer % cla_factor == 0 for layer in range(num_layers)]
        self._local: List[bool] = [
            bool(local_group_every) and g % local_group_every == 1 for g in range(self.num_groups)
        ]
        self._check_table()

    def _check_table(self) -> None:
        # invariant of the tables built above, not a check of the caller's input
        assert len(self._group_of) == len(self._producer) == self.num_layers  # ok: FC109
        assert sum(self._producer) == self.num_groups

    def group_of(self, layer_id: int) -> int:
        return self._group_of[layer_id]

    def is_producer(self, layer_id: int) -> bool:
        return self._producer[layer_id]

    def is_local(self, group: int) -> bool:
        return self._local[group]

    def producer_of(self, group: int) -> int:
        return group * self.cla_factor

    def layers_of(self, group: int) -> List[int]:
        first = self.producer_of(group)
        return list(range(first, first + self.cla_factor))

    def local_groups(self) -> List[int]:
        return [g for g in range(self.num_groups) if self._local[g]]
