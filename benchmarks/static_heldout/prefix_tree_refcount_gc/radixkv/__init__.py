"""Radix-tree prefix cache over reference-counted KV pages."""

from .node import RadixNode
from .refcount import PageRefCounter
from .tree import MatchResult, RadixTree

__all__ = ["MatchResult", "PageRefCounter", "RadixNode", "RadixTree"]
