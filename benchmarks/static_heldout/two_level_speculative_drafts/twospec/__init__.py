"""Two-level speculative decoding: n-gram chains, a small draft model, tree verification."""

from .config import SpecConfig
from .ngram import NgramIndex
from .tree import DraftTree, TreeMaskPacker

__all__ = ["SpecConfig", "NgramIndex", "DraftTree", "TreeMaskPacker"]
