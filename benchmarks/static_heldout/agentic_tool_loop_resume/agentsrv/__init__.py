"""Agent serving: requests that pause on tool calls and resume with the tool's output."""
from agentsrv.requests import AgentRequest, ReqState, ToolCall
from agentsrv.settings import AgentSettings

__all__ = ["AgentRequest", "AgentSettings", "ReqState", "ToolCall"]
