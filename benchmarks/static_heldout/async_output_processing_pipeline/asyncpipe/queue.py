"""A bounded queue between the launch stage and the post-processing stage."""

import collections
import threading
from typing import Any, Deque, Optional


class BoundedStepQueue:
    def __init__(self, maxsize: int):
        assert maxsize >= 1, "the pipeline needs room for at least one step in flight"  # expect: FC109
        self._maxsize = maxsize
        self._items: Deque[Any] = collections.deque()
        self._cv = threading.Condition()
        self._closed = False

    def put(self, item: Any) -> None:
        with self._cv:
            while len(self._items) >= self._maxsize and not self._closed:
                self._cv.wait()
            self._items.append(item)
            self._check_invariant()
            self._cv.notify_all()

    def get(self, timeout: Optional[float] = None) -> Any:
        with self._cv:
            while not self._items and not self._closed:
                if not self._cv.wait(timeout):
                    return None
            if not self._items:
                return None
            item = self._items.popleft()
            self._cv.notify_all()
            return item

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()

    def __len__(self) -> int:
        with self._cv:
            return len(self._items)

    def _check_invariant(self) -> None:
        assert len(self._items) <= self._maxsize, "queue overran its bound"  # ok: FC109
