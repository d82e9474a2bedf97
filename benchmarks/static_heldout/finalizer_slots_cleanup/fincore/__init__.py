from fincore.limits import PAGE_SIZE, ServeLimits, WsSize
from fincore.state import DecodeBatch, RequestState, build_batch

__all__ = ["PAGE_SIZE", "ServeLimits", "WsSize", "DecodeBatch", "RequestState", "build_batch"]
