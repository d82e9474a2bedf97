"""Listener lists: bound methods (kept alive) or weakref.WeakMethod entries (dropped with their owner)."""
import weakref
from typing import Any, Callable, List, Union

Listener = Union[Callable[..., Any], weakref.WeakMethod]


class ListenerList:
    def __init__(self, name: str):
        self.name = name
        self._items: List[Listener] = []

    def add(self, callback: Callable[..., Any], weak: bool = False) -> None:
        assert callable(callback)  # expect: FC109
        self._items.append(weakref.WeakMethod(callback) if weak else callback)

    def emit(self, *args: Any) -> int:
        alive: List[Listener] = []
        for item in self._items:
            fn = item() if isinstance(item, weakref.WeakMethod) else item
            if fn is not None:  # the owner of a weak listener is gone: drop it
                alive.append(item)
                fn(*args)
        assert len(alive) <= len(self._items)  # ok: FC109
        self._items = alive
        return len(alive)
