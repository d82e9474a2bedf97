from swaring.config import SWAConfig
from swaring.ring import RingPageTable, RingState

__all__ = ["SWAConfig", "RingPageTable", "RingState"]
