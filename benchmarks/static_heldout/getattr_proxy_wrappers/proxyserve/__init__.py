from .batch import ForwardBatch, window_indptr
from .config import GRAPH_BUCKETS, PAGE_SIZE, ServeConfig, WsSize, scratch_workspace
from .instrument import instrument, step_timer
from .proxy import Fp8KvShim, TracedWrapper

__all__ = ["GRAPH_BUCKETS", "PAGE_SIZE", "ForwardBatch", "Fp8KvShim", "ServeConfig", "TracedWrapper", "WsSize",
           "instrument", "scratch_workspace", "step_timer", "window_indptr"]
