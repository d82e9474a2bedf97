"""Per-request page lists: the first `num_sink_pages` pages are pinned, the rest roll as a window."""
from collections import deque

import numpy as np


class SinkWindowPageTable:
    def __init__(self, num_sink_pages: int, window_pages: int, page_size: int, num_pages: int):
        assert num_sink_pages < window_pages  # expect: FC109
        self.num_sink_pages = num_sink_pages
        self.window_pages = window_pages
        self.page_size = page_size
        self.free_pages = deque(range(num_pages))
        self.sinks: dict[int, list[int]] = {}
        self.window: dict[int, deque] = {}
        self.fill: dict[int, int] = {}

    def add(self, rid: int, prompt_len: int):
        n = -(-prompt_len // self.page_size)
        pages = [self.free_pages.popleft() for _ in range(n)]
        self.sinks[rid] = pages[: self.num_sink_pages]
        self.window[rid] = deque(pages[self.num_sink_pages :])
        self.fill[rid] = prompt_len - (n - 1) * self.page_size
        self._evict(rid)

    def append_token(self, rid: int):
        if self.fill[rid] == self.page_size:
            self.window[rid].append(self.free_pages.popleft())
            self.fill[rid] = 0
            self._evict(rid)
        self.fill[rid] += 1

    def _evict(self, rid: int):
        win = self.window[rid]
        while len(win) > self.window_pages:
            self.free_pages.append(win.popleft())

    def cache_len(self, rid: int) -> int:
        return (len(self.sinks[rid]) + len(self.window[rid]) - 1) * self.page_size + self.fill[rid]

    def window_array(self, rid: int) -> np.ndarray:
        return np.fromiter(self.window[rid], dtype=np.int32, count=len(self.window[rid]))

    def release(self, rid: int):
        self.free_pages.extend(self.sinks.pop(rid))
        self.free_pages.extend(self.window.pop(rid))
        del self.fill[rid]
