"""Static token tree (Medusa choices / EAGLE top-k expansion): parents, attention mask, leaf paths."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Sequence, Tuple

import numpy as np
import torch

MAX_TREE_DEPTH = 8


@dataclass(frozen=True)
class TreeSpec:
    parents: Tuple[int, ...]
    depth: int

    @classmethod
    def from_choices(cls, choices: Sequence[Tuple[int, ...]]) -> "TreeSpec":
        assert all(len(c) < MAX_TREE_DEPTH for c in choices), "tree deeper than MAX_TREE_DEPTH"  # expect: FC109
        nodes = [()] + sorted(choices, key=lambda c: (len(c), c))
        index = {c: i for i, c in enumerate(nodes)}
        parents = tuple(-1 if not c else index[c[:-1]] for c in nodes)
        return cls(parents=parents, depth=max(len(c) for c in nodes) + 1)

    @property
    def num_nodes(self) -> int:
        return len(self.parents)

    @functools.cached_property
    def tree_mask(self) -> torch.Tensor:
        n = self.num_nodes
        mask = torch.zeros(n, n, dtype=torch.bool)
        for i in range(n):
            j = i
            while j >= 0:
                mask[i, j] = True
                j = self.parents[j]
        return mask

    @functools.cached_property
    def retrieve_indices(self) -> np.ndarray:
        has_child = np.zeros(self.num_nodes, dtype=bool)
        for p in self.parents[1:]:
            has_child[p] = True
        leaves = np.flatnonzero(~has_child)
        paths = np.full((len(leaves), self.depth), -1, dtype=np.int64)
        for row, leaf in enumerate(leaves):
            path = []
            j = int(leaf)
            while j >= 0:
                path.append(j)
                j = self.parents[j]
            paths[row, : len(path)] = path[::-1]
        return paths

    def full_mask(self, seq_lens_cpu: torch.Tensor) -> torch.Tensor:
        """Flattened per-request masks ``[num_nodes, prefix + num_nodes]`` for ``plan(custom_mask=...)``."""
        parts = []
        for prefix_len in seq_lens_cpu.tolist():  # ok: FC101
            prefix = torch.ones(self.num_nodes, prefix_len, dtype=torch.bool)
            parts.append(torch.cat([prefix, self.tree_mask], dim=1).flatten())
        return torch.cat(parts)
