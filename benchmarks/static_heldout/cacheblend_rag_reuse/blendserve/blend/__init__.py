from blendserve.blend.cow import BlendCoW
from blendserve.blend.selector import HKVDSelector, SelectedTokens

__all__ = ["BlendCoW", "HKVDSelector", "SelectedTokens"]
