"""Jump-forward decoding for grammar-constrained output."""

from .config import JFConfig
from .grammar import TokenFSM, compile_template

__all__ = ["JFConfig", "TokenFSM", "compile_template"]
