"""Attention backends assembled from feature mixins (see ``factory.make_backend``)."""

from .base import AttentionBackendBase
from .factory import FEATURES, make_backend

__all__ = ["AttentionBackendBase", "FEATURES", "make_backend"]
