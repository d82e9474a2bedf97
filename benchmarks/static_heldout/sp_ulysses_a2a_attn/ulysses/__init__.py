"""ulysses: sequence-parallel attention with all-to-all head scattering (DeepSpeed-Ulysses style)."""

from ulysses.config import UlyssesConfig, split_heads

__all__ = ["UlyssesConfig", "split_heads"]
