"""Per-request thinking budgets for reasoning models."""
from reasoning.budget import BudgetTracker
from reasoning.config import ReasoningConfig
from reasoning.hook import SamplerHook, ThinkingBudgetHook

__all__ = ["BudgetTracker", "ReasoningConfig", "SamplerHook", "ThinkingBudgetHook"]
