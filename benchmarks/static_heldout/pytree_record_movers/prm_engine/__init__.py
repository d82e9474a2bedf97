"""prm_engine: a small SGLang-shaped engine with pytree-moved per-step records."""

from prm_engine.config import EngineConfig

__all__ = ["EngineConfig"]
