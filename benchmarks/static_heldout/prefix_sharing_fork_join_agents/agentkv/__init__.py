"""Agent serving: conversations fork into tool-call branches that share KV pages copy-on-write."""

from agentkv.branches import Branch, BranchTable, Conversation
from agentkv.config import AgentServeConfig
from agentkv.cow_pages import CowPagePool

__all__ = ["AgentServeConfig", "Branch", "BranchTable", "Conversation", "CowPagePool"]
