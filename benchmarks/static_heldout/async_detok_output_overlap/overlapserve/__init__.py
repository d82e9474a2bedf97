"""A server that overlaps detokenization and streaming output with the next forward step."""

from .requests import GenRequest, StopChecker
from .settings import PREFILL_WS_BYTES, ServeSettings

__all__ = ["PREFILL_WS_BYTES", "GenRequest", "ServeSettings", "StopChecker"]
