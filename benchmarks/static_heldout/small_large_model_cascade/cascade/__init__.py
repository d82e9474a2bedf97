"""Small/large model cascade: easy requests stay on the small model, hard ones escalate mid-generation."""

from cascade.config import CascadeConfig, ModelSpec
from cascade.requests import Request, Tier

__all__ = ["CascadeConfig", "ModelSpec", "Request", "Tier"]
