import heapq
import time
from dataclasses import dataclass, field
from typing import List

from .node import RadixNode


@dataclass
class MatchResult:
    pages: List[int] = field(default_factory=list)
    node: RadixNode = None
    matched_tokens: int = 0


class RadixTree:
    """Page-granular radix tree: every edge holds whole pages of tokens."""

    def __init__(self, page_size, refs):
        self.page_size = page_size
        self.refs = refs
        self.root = RadixNode()
        self.root.ref = 1

    def _page_keys(self, token_ids):
        n = len(token_ids) // self.page_size * self.page_size
        return tuple(token_ids[:n])

    def match_prefix(self, token_ids):
        key = self._page_keys(token_ids)
        node, pages, i = self.root, [], 0
        while i < len(key):
            child = node.children.get(key[i : i + self.page_size])
            if child is None:
                break
            common = 0
            while common < len(child.key) and i + common < len(key) and child.key[common] == key[i + common]:
                common += 1
            common = common // self.page_size * self.page_size
            pages.extend(child.pages[: common // self.page_size])
            i += common
            child.last_access = time.monotonic()
            if common < len(child.key):
                break
            node = child
        return MatchResult(pages=pages, node=node, matched_tokens=i)

    def insert(self, token_ids, pages):
        assert len(token_ids) == len(pages) * self.page_size  # expect: FC109
        node, i = self.root, 0
        key = tuple(token_ids)
        while i < len(key):
            edge = key[i : i + self.page_size]
            child = node.children.get(edge)
            if child is None:
                child = RadixNode(key[i:], pages[i // self.page_size :], node)
                node.children[edge] = child
                self.refs.incref(child.pages)
                return child
            common = 0
            while common < len(child.key) and i + common < len(key) and child.key[common] == key[i + common]:
                common += 1
            common = common // self.page_size * self.page_size
            if common < len(child.key):
                child = self._split(child, common)
            node, i = child, i + common
        return node

    def _split(self, child, at):
        parent = child.parent
        head = RadixNode(child.key[:at], child.pages[: at // self.page_size], parent)
        parent.children[child.key[: self.page_size]] = head
        child.key = child.key[at:]
        child.pages = child.pages[at // self.page_size :]
        child.parent = head
        head.children[child.key[: self.page_size]] = child
        head.ref = child.ref
        return head

    def lock(self, node):
        while node is not None:
            node.ref += 1
            node = node.parent

    def unlock(self, node):
        while node is not None:
            node.ref -= 1
            node = node.parent

    def evict(self, num_pages):
        heap = [(n.last_access, id(n), n) for n in self._leaves() if n.ref == 0]
        heapq.heapify(heap)
        freed = 0
        while heap and freed < num_pages:
            _, _, leaf = heapq.heappop(heap)
            freed += self._evict_leaf(leaf)
            parent = leaf.parent
            if parent is not self.root and parent.is_leaf() and parent.ref == 0:
                heapq.heappush(heap, (parent.last_access, id(parent), parent))
        return freed

    def _evict_leaf(self, node):
        assert node.ref == 0 and node.is_leaf()  # ok: FC109
        del node.parent.children[node.key[: self.page_size]]
        self.refs.decref(node.pages)
        return len(node.pages)

    def _leaves(self):
        stack = [self.root]
        while stack:
            n = stack.pop()
            if n.is_leaf() and n is not self.root:
                yield n
            stack.extend(n.children.values())
