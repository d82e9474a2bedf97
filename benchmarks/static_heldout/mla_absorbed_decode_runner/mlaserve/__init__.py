from mlaserve.config import MLAConfig, WsBytes
from mlaserve.kvpool import CompressedKVPool
from mlaserve.weights import AbsorbedWeights, absorb

__all__ = ["MLAConfig", "WsBytes", "CompressedKVPool", "AbsorbedWeights", "absorb"]
