"""podserve: chunked prefill and decode in one kernel through FlashInfer POD attention."""

from podserve.config import PodConfig

__all__ = ["PodConfig"]
