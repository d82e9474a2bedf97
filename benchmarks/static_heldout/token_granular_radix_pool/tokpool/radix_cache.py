"""Radix tree over token ids whose values are the KV slots holding them.  Nodes in use by a
running request are locked (``lock_ref``) and never evicted."""

from __future__ import annotations

import heapq
import time
from collections import defaultdict
from typing import TYPE_CHECKING, List, Optional, Tuple

import torch

from tokpool.memory_pool import BaseTokenToKVPool, ReqToTokenPool

if TYPE_CHECKING:
    from tok_srt.schedule_batch import Req


class TreeNode:
    counter = 0

    def __init__(self):
        self.children = defaultdict(TreeNode)
        self.parent: Optional[TreeNode] = None
        self.key: List[int] = []
        self.value: Optional[torch.Tensor] = None
        self.lock_ref = 0
        self.last_access_time = time.monotonic()
        self.id = TreeNode.counter
        TreeNode.counter += 1

    def __lt__(self, other: "TreeNode") -> bool:
        return self.last_access_time < other.last_access_time


def _key_match(key0: List[int], key1: List[int]) -> int:
    i = 0
    for a, b in zip(key0, key1):
        if a != b:
            break
        i += 1
    return i


class RadixCache:
    def __init__(self, req_to_token_pool: ReqToTokenPool, token_to_kv_pool: BaseTokenToKVPool):
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool = token_to_kv_pool
        self.device = token_to_kv_pool.device
        self.reset()

    def reset(self) -> None:
        self.root = TreeNode()
        self.root.key = []
        self.root.value = torch.empty((0,), dtype=torch.int64, device=self.device)
        self.root.lock_ref = 1
        self.evictable_size_ = 0

    # ------------------------------------------------------------------ lookups
    def match_prefix(self, key: List[int]) -> Tuple[torch.Tensor, TreeNode]:
        values: List[torch.Tensor] = []
        node = self.root
        while key:
            child = node.children.get(key[0])
            if child is None:
                break
            child.last_access_time = time.monotonic()
            n = _key_match(child.key, key)
            if n < len(child.key):
                child = self._split_node(child, n)
                values.append(child.value)
                node = child
                break
            values.append(child.value)
            node = child
            key = key[n:]
        value = torch.cat(values) if values else torch.empty((0,), dtype=torch.int64, device=self.device)
        return value, node

    def insert(self, key: List[int], value: torch.Tensor) -> int:
        """Insert ``key`` -> ``value``; returns how many leading tokens were already cached."""
        node = self.root
        matched = 0
        while key:
            child = node.children.get(key[0])
            if child is None:
                new = TreeNode()
                new.parent = node
                new.key = list(key)
                new.value = value
                node.children[key[0]] = new
                self.evictable_size_ += len(key)
                return matched
            n = _key_match(child.key, key)
            if n < len(child.key):
                child = self._split_node(child, n)
            child.last_access_time = time.monotonic()
            matched += n
            node = child
            key, value = key[n:], value[n:]
        return matched

    def _split_node(self, child: TreeNode, split_len: int) -> TreeNode:
        new = TreeNode()
        new.parent = child.parent
        new.key = child.key[:split_len]
        new.value = child.value[:split_len]
        new.lock_ref = child.lock_ref
        new.children = defaultdict(TreeNode, {child.key[split_len]: child})
        child.parent = new
        child.key = child.key[split_len:]
        child.value = child.value[split_len:]
        new.parent.children[new.key[0]] = new
        return new

    # ------------------------------------------------------------------ request hooks
    def cache_finished_req(self, req: "Req") -> None:
        token_ids = (req.origin_input_ids + req.output_ids)[:-1]
        kv_indices = self.req_to_token_pool.req_to_token[req.req_pool_idx, : len(token_ids)].to(torch.int64)
        new_prefix_len = self.insert(token_ids, kv_indices.clone())
        self.token_to_kv_pool.free(kv_indices[len(req.prefix_indices) : new_prefix_len])
        self.req_to_token_pool.free(req.req_pool_idx)
        self.dec_lock_ref(req.last_node)

    # ------------------------------------------------------------------ locking / eviction
    def inc_lock_ref(self, node: TreeNode) -> None:
        while node is not self.root:
            if node.lock_ref == 0:
                self.evictable_size_ -= len(node.key)
            node.lock_ref += 1
            node = node.parent

    def dec_lock_ref(self, node: TreeNode) -> None:
        assert node.lock_ref > 0, "dec_lock_ref without a matching inc_lock_ref"  # expect: FC109
        while node is not self.root:
            if node.lock_ref == 1:
                self.evictable_size_ += len(node.key)
            node.lock_ref -= 1
            node = node.parent

    def evictable_size(self) -> int:
        return self.evictable_size_

    def _collect_leaves(self) -> List[TreeNode]:
        leaves, stack = [], [self.root]
        while stack:
            cur = stack.pop()
            if not cur.children:
                leaves.append(cur)
            stack.extend(cur.children.values())
        return leaves

    def evict(self, num_tokens: int) -> int:
        leaves = self._collect_leaves()
        heapq.heapify(leaves)
        evicted = 0
        while evicted < num_tokens and leaves:
            x = heapq.heappop(leaves)
            if x is self.root:
                break
            if x.lock_ref > 0:
                continue
            self.token_to_kv_pool.free(x.value)
            evicted += len(x.value)
            self._delete_leaf(x)
            if not x.parent.children and x.parent.lock_ref == 0:
                heapq.heappush(leaves, x.parent)
        return evicted

    def _delete_leaf(self, node: TreeNode) -> None:
        assert node.lock_ref == 0, "evicting a locked node"  # ok: FC109
        del node.parent.children[node.key[0]]
        self.evictable_size_ -= len(node.key)

    def remap_values(self, remap: torch.Tensor) -> None:
        stack = [self.root]
        while stack:
            node = stack.pop()
            if node.value is not None and node.value.numel():
                node.value = remap[node.value]
            stack.extend(node.children.values())
