"""Scoped decode engine: configuration, batches and step scopes."""
from scopes.batch import DecodeBatch, ExtendBatch
from scopes.config import EngineConfig
from scopes.step_scope import StepScope

__all__ = ["DecodeBatch", "EngineConfig", "ExtendBatch", "StepScope"]
