"""Lookahead (Jacobi + n-gram pool) speculative decoding with Medusa heads on a FlashInfer verifier."""

from . import limits as lim
from .backend import LookaheadAttnBackend
from .drafting import LookaheadBranch, MedusaHeads, NgramPool
from .limits import SpecLimits

__all__ = ["LookaheadAttnBackend", "LookaheadBranch", "MedusaHeads", "NgramPool", "SpecLimits", "lim"]
