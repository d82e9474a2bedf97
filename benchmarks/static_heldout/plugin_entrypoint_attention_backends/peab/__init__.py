"""peab: an engine whose attention backends are plugins, chosen per layer type."""
from peab.config import LAYER_FULL, LAYER_SLIDING, EngineConfig
from peab.registry import create_backend, load_backend, register_backend, registered

__all__ = ["EngineConfig", "LAYER_FULL", "LAYER_SLIDING", "create_backend", "load_backend", "register_backend", "registered"]
