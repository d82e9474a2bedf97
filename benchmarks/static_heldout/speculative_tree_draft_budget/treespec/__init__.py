"""Budgeted tree speculation: token budgets, tree topologies, masks and page pools."""
from treespec.budget import TokenBudget
from treespec.config import SpecConfig
from treespec.pages import PagePool

__all__ = ["SpecConfig", "TokenBudget", "PagePool"]
