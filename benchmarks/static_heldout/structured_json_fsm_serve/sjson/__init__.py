"""Structured-output (JSON schema) serving: server limits and grammar compilation."""
from sjson.config import DECODE_WORKSPACE_BYTES, ServerConfig

__all__ = ["DECODE_WORKSPACE_BYTES", "ServerConfig"]
