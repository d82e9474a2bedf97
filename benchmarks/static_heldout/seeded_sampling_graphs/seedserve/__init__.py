"""Reproducible seeded sampling inside captured decode graphs."""

from .config import ServeConfig
from .params import Request, SamplingParams

__all__ = ["ServeConfig", "Request", "SamplingParams"]
