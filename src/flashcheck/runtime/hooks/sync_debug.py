"""Layer ``sync_debug``: torch's sync debug mode in "warn", its warnings turned into events.

Catches what reaches ``c10::cuda::warn_or_error_on_sync``: ``.item()``, ``.cpu()``, ``.tolist()``, ``bool(t)``,
``nonzero``, boolean-mask indexing, ``torch.tensor(list, device=cuda)``, ``stream.synchronize()`` and blocking
pageable copies, each with the Python stack of the call. Misses (measured on an H100): ``torch.cuda
.synchronize()``, ``Event.synchronize()``, every ``non_blocking=True`` copy (pageable ones block silently), and every
sync inside a C++ extension (FlashInfer's ``plan()``). The mode is process-global; it stays armed while the hook is
installed, so opening a region costs nothing here; a sync outside every hot region (or inside the checker's own
reads, or on another thread) is dropped by the monitor, at the price of one Python warning per such sync.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from typing import Any

from flashcheck.runtime.hooks.base import EventSink, Hook
from flashcheck.runtime.monitor import Event
from flashcheck.runtime.stacks import capture_stack

__all__ = ["PROTOTYPE_TEXT", "SYNC_TEXT", "SyncDebugHook"]

SYNC_TEXT = "called a synchronizing CUDA operation"
PROTOTYPE_TEXT = "Synchronization debug mode is a prototype feature"
ShowWarning = Callable[..., Any]


def _torch_get_mode() -> int:
    import torch

    return int(torch.cuda.get_sync_debug_mode())


def _torch_set_mode(mode: int) -> None:
    import torch

    # the binding itself where this build has it (CUDA builds): torch.cuda.set_sync_debug_mode adds argument parsing
    # to a call made twice per hot region
    setter = getattr(torch._C, "_cuda_set_sync_debug_mode", None) or torch.cuda.set_sync_debug_mode
    setter(mode)


class SyncDebugHook(Hook):
    """Arms ``torch.cuda.set_sync_debug_mode("warn")`` while installed and routes its warnings to the monitor.

    Installs a ``warnings.showwarning`` that chains to the previous one (pytest's, another tool's) for every other
    warning, and an "always" filter for the sync message (the default filter shows a warning once per line, which
    would hide a sync in a loop). Both are restored on uninstall; the previous sync debug mode too. If the mode was
    already "warn" or "error" when installed, the hook leaves it alone and forwards the warnings it sees.
    """

    layer = "sync_debug"
    reports = (Event("sync", "sync_debug"),)

    def __init__(
        self,
        *,
        get_mode: Callable[[], int] | None = None,
        set_mode: Callable[[int], None] | None = None,
        available: Callable[[], bool] | None = None,
    ) -> None:
        super().__init__()
        self._get_mode = get_mode or _torch_get_mode
        self._set_mode = set_mode or _torch_set_mode
        self._available = available
        self._prev_mode = 0
        self._prev_show: ShowWarning | None = None
        self._filter: tuple[Any, ...] | None = None
        self._show: ShowWarning = self._showwarning  # one bound method, compared by identity in `refresh`
        self._seen: tuple[object, int] = (None, 0)  # the filter list (and its length) `refresh` last found us in

    def unavailable_reason(self) -> str | None:
        if self._available is not None:
            return None if self._available() else "no CUDA device"
        import torch

        return None if torch.cuda.is_available() else "no CUDA device (sync debug mode needs one)"

    # ---------------------------------------------------------------------------------------- life cycle
    def _install(self, sink: EventSink) -> None:
        self._prev_mode = self._get_mode()
        if self._prev_mode == 0:
            # Armed for the whole installation, with torch's one-time prototype warning silenced.
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=PROTOTYPE_TEXT)
                self._set_mode(1)
        self._install_warning_hook()

    def _install_warning_hook(self) -> None:
        self._prev_show = warnings.showwarning
        warnings.showwarning = self._show
        warnings.filterwarnings("always", message=".*" + SYNC_TEXT)
        self._filter = warnings.filters[0]
        self._seen = (warnings.filters, len(warnings.filters))

    def _remove_warning_hook(self) -> None:
        if warnings.showwarning is self._show and self._prev_show is not None:
            warnings.showwarning = self._prev_show
        if self._filter is not None and self._filter in warnings.filters:
            warnings.filters.remove(self._filter)  # type: ignore[attr-defined]  # a list at run time
            mutated = getattr(warnings, "_filters_mutated", None)
            if mutated is not None:
                mutated()
        self._filter = None
        self._prev_show = None

    def _uninstall(self) -> None:
        try:
            if self._prev_mode == 0:
                self._set_mode(0)
        finally:
            self._remove_warning_hook()

    def refresh(self) -> None:
        # pytest's catch_warnings (and others) restore showwarning and the filters behind our back: re-hook. Called
        # at every outermost region, so the usual case is three identity and length checks (comparing filters is
        # slow: their patterns compare by value).
        filters = warnings.filters
        if warnings.showwarning is self._show and filters is self._seen[0] and len(filters) == self._seen[1]:
            return
        if warnings.showwarning is not self._show or self._filter not in filters:
            self._remove_warning_hook()
            self._install_warning_hook()
        self._seen = (warnings.filters, len(warnings.filters))

    # ------------------------------------------------------------------------------------------- warnings
    def _showwarning(
        self,
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: Any = None,
        line: str | None = None,
    ) -> None:
        text = str(message)
        if SYNC_TEXT in text:
            try:
                # the checker's own reads and everything outside hot regions sync too (a driver step does it a
                # few times): asking first spares them the stack, which the monitor would drop
                sink = self._sink
                if sink is not None and sink.watching(threading.get_ident()):
                    self._emit(
                        Event(
                            "sync",
                            "sync_debug",
                            capture_stack(2),
                            "synchronizing CUDA operation (sync debug mode)",
                            thread=threading.get_ident(),
                        )
                    )
            except Exception as exc:  # never break the user's program; never lose the failure either
                self._error(exc)
            if self._prev_mode == 0:
                return  # our own arming produced it: consumed
        elif PROTOTYPE_TEXT in text:
            return
        self._chain(message, category, filename, lineno, file, line)

    def _chain(
        self,
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: Any,
        line: str | None,
    ) -> None:
        prev = self._prev_show
        orig = getattr(warnings, "_showwarning_orig", None)
        impl = getattr(warnings, "_showwarnmsg_impl", None)
        if prev is None or (prev is orig and impl is not None):
            # The default showwarning: go through the implementation catch_warnings(record=True) replaces, so
            # pytest's recorder still sees the warning.
            if impl is not None:
                impl(warnings.WarningMessage(message, category, filename, lineno, file, line))
            return
        prev(message, category, filename, lineno, file, line)
