from duplex.attention.depth import DepthAttnState
from duplex.attention.temporal import TemporalAttnState

__all__ = ["DepthAttnState", "TemporalAttnState"]
