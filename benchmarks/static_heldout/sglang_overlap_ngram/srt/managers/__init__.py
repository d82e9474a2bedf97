from .overlap_worker import FutureMap, TpModelWorkerClient, resolve_future_token_ids
from .tp_worker import TpModelWorker

__all__ = ["FutureMap", "TpModelWorker", "TpModelWorkerClient", "resolve_future_token_ids"]
