import collections
import queue
import threading

from overlapserve.detok.incremental import IncrementalDetokenizer


class DetokWorker:
    """Detokenizer thread: waits for a step's D2H copy event, detokenizes, checks stop strings, streams."""

    def __init__(self, ring, tokenizer, stop_checker, emit):
        self.ring = ring
        self.tokenizer = tokenizer
        self.stop_checker = stop_checker
        self.emit = emit
        self.inbox = queue.Queue()
        self.finished = queue.Queue()
        self.detoks = {}
        self.pending = collections.deque()
        self._thread = None

    def start(self):
        assert self._thread is None  # ok: FC109
        self._thread = threading.Thread(target=self._loop, name="detok", daemon=True)
        self._thread.start()

    def register(self, req):
        self.detoks[req.rid] = IncrementalDetokenizer(self.tokenizer, req.prompt_ids)

    def submit(self, slot, rids, bs):
        self.inbox.put((slot, list(rids), bs))

    def stop(self):
        self.inbox.put(None)

    def _loop(self):
        while True:
            item = self.inbox.get()
            if item is None:
                return
            self.pending.append(item)
            self._pop_ready()

    def _pop_ready(self):
        depth = len(self.pending)
        assert depth <= self.ring.depth  # ok: FC109
        while self.pending:
            slot, rids, bs = self.pending.popleft()
            self.ring.events[slot].synchronize()  # ok: FC101
            ids = self.ring.host_ids[slot][:bs].tolist()
            for rid, tok in zip(rids, ids):
                d = self.detoks.get(rid)
                if d is None:
                    continue
                before = d.text
                delta = d.push([tok])
                cut = self.stop_checker.check(rid, before, delta)
                if cut >= 0:
                    d.text = d.text[:cut]
                    self.finished.put(rid)
                    self.emit(rid, d.text[len(before) :], True)
                else:
                    self.emit(rid, delta, False)
