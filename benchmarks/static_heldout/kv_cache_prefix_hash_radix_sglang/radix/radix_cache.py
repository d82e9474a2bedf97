"""Token-level radix tree over cached prefixes; values are device token slots."""
from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch

from .allocator import PagedTokenAllocator


@dataclass(eq=False)
class TreeNode:
    key: List[int]
    value: Optional[torch.Tensor]
    parent: Optional["TreeNode"] = None
    children: Dict[int, "TreeNode"] = field(default_factory=dict)
    lock_ref: int = 0
    last_access: float = field(default_factory=time.monotonic)

    def __lt__(self, other: "TreeNode") -> bool:
        return self.last_access < other.last_access


def _key_match(a: List[int], b: List[int]) -> int:
    n = min(len(a), len(b))  # ok: FC101
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class RadixCache:
    def __init__(self, allocator: PagedTokenAllocator):
        self.allocator = allocator
        self.root = TreeNode(key=[], value=None, lock_ref=1)
        self.empty_slots = torch.zeros(0, dtype=torch.int32, device=allocator.device)
        self.evictable_size_ = 0
        self.protected_size_ = 0

    def match_prefix(self, key: List[int]) -> Tuple[torch.Tensor, TreeNode]:
        values: List[torch.Tensor] = []
        node = self.root
        while key:
            child = node.children.get(key[0])
            if child is None:
                break
            child.last_access = time.monotonic()
            n = _key_match(child.key, key)
            if n < len(child.key):
                child = self._split_node(child, n)
                values.append(child.value)
                node = child
                break
            values.append(child.value)
            node = child
            key = key[n:]
        if not values:
            return self.empty_slots, node
        return torch.cat(values), node

    def insert(self, key: List[int], value: torch.Tensor) -> None:
        node = self.root
        while key:
            child = node.children.get(key[0])
            if child is None:
                node.children[key[0]] = TreeNode(key=list(key), value=value, parent=node)
                self.evictable_size_ += len(key)
                return
            n = _key_match(child.key, key)
            if n < len(child.key):
                child = self._split_node(child, n)
            node, key, value = child, key[n:], value[n:]

    def _split_node(self, child: TreeNode, split: int) -> TreeNode:
        parent = child.parent
        new = TreeNode(key=child.key[:split], value=child.value[:split], parent=parent, lock_ref=child.lock_ref)
        child.key, child.value = child.key[split:], child.value[split:]
        child.parent = new
        new.children[child.key[0]] = child
        parent.children[new.key[0]] = new
        return new

    def inc_lock_ref(self, node: TreeNode) -> None:
        while node is not self.root:
            if node.lock_ref == 0:
                self.evictable_size_ -= len(node.key)
                self.protected_size_ += len(node.key)
            node.lock_ref += 1
            node = node.parent

    def dec_lock_ref(self, node: TreeNode) -> None:
        assert node.lock_ref > 0, "unbalanced lock_ref"  # expect: FC109
        while node is not self.root:
            if node.lock_ref == 1:
                self.evictable_size_ += len(node.key)
                self.protected_size_ -= len(node.key)
            node.lock_ref -= 1
            node = node.parent

    def _leaves(self) -> List[TreeNode]:
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            if not node.children and node is not self.root:
                out.append(node)
            stack.extend(node.children.values())
        return out

    def evict(self, num_tokens: int) -> int:
        leaves = [n for n in self._leaves() if n.lock_ref == 0]
        heapq.heapify(leaves)
        freed = 0
        while freed < num_tokens and leaves:
            node = heapq.heappop(leaves)
            self.allocator.free(node.value)
            freed += len(node.key)
            self.evictable_size_ -= len(node.key)
            parent = node.parent
            del parent.children[node.key[0]]
            if not parent.children and parent.lock_ref == 0 and parent is not self.root:
                heapq.heappush(leaves, parent)
        self._check_invariants()
        return freed

    def lru_timestamps(self) -> List[float]:
        return [n.last_access for n in self._leaves() if n.lock_ref == 0]

    def _check_invariants(self) -> None:
        assert self.evictable_size_ >= 0 and self.protected_size_ >= 0, "radix size accounting broke"  # ok: FC109
