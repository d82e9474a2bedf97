from .config import Tier, TierConfig
from .tier_table import TierTable

__all__ = ["Tier", "TierConfig", "TierTable"]
