import threading

import torch


class PageGC:
    """Background collector: returns pages whose count reached zero to the free list after scrubbing every
    reference the attention backend still holds to them."""

    def __init__(self, refs, backend, interval_s=0.005):
        self.refs = refs
        self.backend = backend
        self.interval_s = interval_s
        self.stream = torch.cuda.Stream()
        self.null_page = 0
        self.freed_total = 0
        self._stop = threading.Event()
        self._thread = None

    def start(self):
        self._thread = threading.Thread(target=self._run, name="page-gc", daemon=True)
        self._thread.start()

    def shutdown(self):
        self._stop.set()

    def _run(self):
        while not self._stop.wait(self.interval_s):
            self.collect()

    def collect(self):
        with self.refs.lock:
            dead = self.refs.pending_free
            self.refs.pending_free = []
        if not dead:
            return 0
        dead_dev = torch.tensor(dead, dtype=torch.int32).to(self.backend.device, non_blocking=True)
        with torch.cuda.stream(self.stream):
            stale = torch.isin(self.backend.kv_indices, dead_dev)
            # a padded graph row may still name a dead page: point it at the null page before reuse
            self.backend.kv_indices.masked_fill_(stale, self.null_page)  # expect: FC104
            self.stream.synchronize()  # ok: FC101
        self.refs.free_list.extend(dead)
        self.freed_total += len(dead)
        return len(dead)
