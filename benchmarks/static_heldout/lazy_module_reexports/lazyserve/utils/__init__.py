"""Host-side helpers and buffer factories shared by the runtime and the attention backends.

Everything public in ``host`` and ``buffers`` is re-exported here; the ``buffers``
module itself is exported too, for the sizes that start-up code rebinds.
"""
from . import buffers
from .buffers import *  # noqa: F401,F403
from .buffers import __all__ as _buffers_all
from .host import *  # noqa: F401,F403
from .host import __all__ as _host_all

__all__ = ["buffers", *_buffers_all, *_host_all]
