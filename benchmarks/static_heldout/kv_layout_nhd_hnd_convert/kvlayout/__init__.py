"""Paged KV pools in NHD and HND layouts, page conversion between them and request migration."""

from kvlayout.layouts import KVLayout

__all__ = ["KVLayout"]
