"""ringserve: a decode server for sliding-window models that keeps each request's KV in a ring of pages."""

from ringserve.config import RingConfig

__all__ = ["RingConfig"]
