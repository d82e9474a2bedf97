"""gsrt: a small FlashInfer serving runtime written in the old script style.

Per-step state is kept in module globals (``gsrt.state``), wrappers and workspaces in ``gsrt.wrappers``,
and the plan / capture / replay logic in free functions that read and rebind them.  Modules are used as
namespaces: ``from . import state as S`` then ``S.kv_indptr[...]``.
"""

__version__ = "0.3.0"
