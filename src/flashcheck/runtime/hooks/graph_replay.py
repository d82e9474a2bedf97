"""Layer ``graph_replay``: wraps ``torch.cuda.CUDAGraph.replay`` so a replay outside any region is still checked.

When the driver has no region open, the wrapper opens an implicit ``replay`` region around ``graph.replay()`` (a
user's own runner code then gets the replay rules without calling the checker). It chains to whatever ``replay``
was installed before (FlashInfer and other tools wrap it too) and restores exactly that on uninstall; if another
tool wrapped on top of ours meanwhile, ours stays in the chain, inert, rather than cutting theirs out.
Catches nothing by itself: it only opens regions for the other layers.
"""

from __future__ import annotations

import functools
from typing import Any

from flashcheck.runtime.hooks._patch import MethodPatch
from flashcheck.runtime.hooks.base import EventSink, Hook

__all__ = ["GraphReplayHook"]


class GraphReplayHook(Hook):
    """Wraps ``owner.replay`` (default ``torch.cuda.CUDAGraph``)."""

    layer = "graph_replay"

    def __init__(self, owner: Any = None) -> None:
        super().__init__()
        self._owner = owner
        self._patch = MethodPatch("replay")
        self._active = False

    @property
    def stranded(self) -> list[Any]:
        """Wrappers of ours left in a chain another tool built on top of (inert)."""
        return self._patch.stranded

    @property
    def _wrapper(self) -> Any:
        return self._patch.wrapper

    def _target(self) -> Any:
        if self._owner is None:
            import torch

            self._owner = torch.cuda.CUDAGraph
        return self._owner

    def _install(self, sink: EventSink) -> None:
        hook = self

        def make(prev: Any) -> Any:
            @functools.wraps(prev)
            def replay(graph: Any, *args: Any, **kwargs: Any) -> Any:
                s = hook._sink
                if not hook._active or s is None or s.region_open():  # the driver's region is open: nothing to add
                    return prev(graph, *args, **kwargs)
                with s.implicit_region("replay"):
                    return prev(graph, *args, **kwargs)

            return replay

        self._patch.apply(self._target(), make)
        self._active = True

    def _uninstall(self) -> None:
        self._active = False
        self._patch.restore()
