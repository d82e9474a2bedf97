"""A token-budget scheduler that mixes chunked-prefill pieces and decodes in one batch."""

from .config import BudgetConfig, WsClass
from .request import Request, SchedulerOutput

__all__ = ["BudgetConfig", "WsClass", "Request", "SchedulerOutput"]
