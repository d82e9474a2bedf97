"""Longest-first batch reordering for decode graphs."""

from .limits import ReorderLimits
from .permutation import PermutationState, invert, longest_first_permutation

__all__ = ["PermutationState", "ReorderLimits", "invert", "longest_first_permutation"]
