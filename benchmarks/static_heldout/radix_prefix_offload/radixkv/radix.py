"""A radix tree over token ids; each edge holds the device page ids of its tokens."""
from __future__ import annotations

import heapq
import time
from typing import Optional

import torch


class TreeNode:
    __slots__ = ("children", "parent", "key", "value", "lock_ref", "last_access", "host_slot")

    def __init__(self, parent: Optional["TreeNode"] = None) -> None:
        self.children: dict[int, TreeNode] = {}
        self.parent = parent
        self.key: list[int] = []
        self.value: Optional[torch.Tensor] = None
        self.lock_ref = 0
        self.last_access = time.monotonic()
        self.host_slot: Optional[int] = None

    def __lt__(self, other: "TreeNode") -> bool:
        return self.last_access < other.last_access


class RadixTree:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.root = TreeNode()
        self.root.value = torch.empty(0, dtype=torch.int32, device=device)
        self.evictable_pages = 0

    def match_prefix(self, key: list[int]) -> tuple[TreeNode, torch.Tensor]:
        assert len(key) > 0, "empty key"  # expect: FC109
        node, values = self.root, []
        while key and key[0] in node.children:
            child = node.children[key[0]]
            n = _common_len(child.key, key)
            if n < len(child.key):
                child = self._split(child, n)
            values.append(child.value)
            child.last_access = time.monotonic()
            node, key = child, key[n:]
        pages = torch.cat(values) if values else self.root.value
        return node, pages

    def insert(self, key: list[int], value: torch.Tensor) -> int:
        assert len(key) == value.numel()  # expect: FC109  # ok: FC101
        node = self.root
        while key:
            child = node.children.get(key[0])
            if child is None:
                new = TreeNode(node)
                new.key, new.value = list(key), value
                node.children[key[0]] = new
                self.evictable_pages += len(key)
                return 0
            n = _common_len(child.key, key)
            if n < len(child.key):
                child = self._split(child, n)
            node, key, value = child, key[n:], value[n:]
        return 0

    def evict(self, num_pages: int) -> list[TreeNode]:
        leaves = [n for n in self._leaves() if n.lock_ref == 0]
        heapq.heapify(leaves)
        out: list[TreeNode] = []
        freed = 0
        while leaves and freed < num_pages:
            leaf = heapq.heappop(leaves)
            freed += len(leaf.key)
            out.append(leaf)
            del leaf.parent.children[leaf.key[0]]
        self.evictable_pages -= freed
        self._check_invariants()
        return out

    def _check_invariants(self) -> None:
        assert self.evictable_pages >= 0  # ok: FC109

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        mid = TreeNode(child.parent)
        mid.key, mid.value = child.key[:n], child.value[:n]
        child.parent.children[child.key[0]] = mid
        child.key, child.value, child.parent = child.key[n:], child.value[n:], mid
        mid.children[child.key[0]] = child
        return mid

    def _leaves(self) -> list[TreeNode]:
        stack, out = [self.root], []
        while stack:
            node = stack.pop()
            if not node.children and node is not self.root:
                out.append(node)
            stack.extend(node.children.values())
        return out


def _common_len(a: list[int], b: list[int]) -> int:
    i = 0
    for x, y in zip(a, b):
        if x != y:
            break
        i += 1
    return i
