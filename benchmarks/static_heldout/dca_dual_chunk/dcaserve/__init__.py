"""dcaserve: dual chunk attention (intra / successive / inter chunk) for million-token contexts."""

from dcaserve.config import DCAConfig

__all__ = ["DCAConfig"]
__version__ = "0.3.0"
