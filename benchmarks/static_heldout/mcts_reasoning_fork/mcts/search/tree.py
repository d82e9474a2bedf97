"""Search tree over partial generations (host only)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List, Optional


@dataclass
class Node:
    tokens: List[int]
    pages: List[int]
    seq_len: int
    parent: Optional["Node"] = None
    prior: float = 1.0
    visits: int = 0
    value_sum: float = 0.0
    terminal: bool = False
    row: int = -1
    children: List["Node"] = field(default_factory=list)

    @property
    def q(self) -> float:
        return self.value_sum / self.visits if self.visits else 0.0


def ucb(child: Node, parent_visits: int, c_puct: float) -> float:
    return child.q + c_puct * child.prior * math.sqrt(parent_visits) / (1 + child.visits)


def select_leaves(root: Node, k: int, c_puct: float) -> List[Node]:
    """Up to ``k`` distinct leaves by repeated UCT descent with virtual visits."""
    leaves: List[Node] = []
    for _ in range(k):
        node = root
        while node.children:
            node.visits += 1  # virtual visit, undone by backprop
            node = max(node.children, key=lambda c: ucb(c, node.visits, c_puct))
        if node.terminal or node in leaves:
            break
        leaves.append(node)
    return leaves


def backprop(node: Node, value: float) -> None:
    while node is not None:
        node.value_sum += value
        node = node.parent
