"""qswitch: one server, two KV-cache dtypes; each request class decodes from the cache that suits it."""

from qswitch.config import SwitchConfig
from qswitch.dtypes import KVClass

__all__ = ["KVClass", "SwitchConfig"]
