from .config import WS_MIB, VideoStreamConfig
from .eviction import FrameEvictionPolicy, KVView
from .frames import FrameChunk, FrameQueue

__all__ = ["WS_MIB", "VideoStreamConfig", "FrameEvictionPolicy", "KVView", "FrameChunk", "FrameQueue"]
