from sso.attention.backend import FlashInferBackend
from sso.attention.registry import StrategyRegistry
from sso.attention.strategies import (
    AttentionStrategy,
    CascadeStrategy,
    DecodeStrategy,
    NullStrategy,
    PrefillStrategy,
)

__all__ = [
    "AttentionStrategy",
    "CascadeStrategy",
    "DecodeStrategy",
    "FlashInferBackend",
    "NullStrategy",
    "PrefillStrategy",
    "StrategyRegistry",
]
