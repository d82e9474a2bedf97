"""Publisher thread: batches of KV events go out on a socket in the order they were queued."""

import logging
import queue
import socket
import struct
import threading
import time
from typing import List, Optional

from .events import KVEvent, KVEventBatch

logger = logging.getLogger(__name__)


class EventPublisher:
    def __init__(self, endpoint: str, max_queue: int = 4096, dp_rank: Optional[int] = None):
        host, port = endpoint.rsplit(":", 1)
        self.addr = (host, int(port))
        self.dp_rank = dp_rank
        self.queue: "queue.Queue[Optional[KVEventBatch]]" = queue.Queue(maxsize=max_queue)
        self.seq = 0
        self.dropped = 0
        self._sock: Optional[socket.socket] = None
        self._thread = threading.Thread(target=self._loop, name="kv-event-publisher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def publish(self, events: List[KVEvent]) -> None:
        if not events:
            return
        batch = KVEventBatch(ts=time.time(), events=list(events), data_parallel_rank=self.dp_rank)
        try:
            self.queue.put_nowait(batch)
        except queue.Full:
            self.dropped += 1

    def _loop(self) -> None:
        while True:
            batch = self.queue.get()
            if batch is None:
                return
            self.seq += 1
            payload = batch.to_json().encode()
            try:
                self._send(struct.pack("<QI", self.seq, len(payload)) + payload)
            except OSError as exc:
                logger.warning("kv event batch %d lost: %s", self.seq, exc)
                self._sock = None

    def _send(self, frame: bytes) -> None:
        if self._sock is None:
            self._sock = socket.create_connection(self.addr, timeout=1.0)
        self._sock.sendall(frame)

    def shutdown(self) -> None:
        self.queue.put(None)
        self._thread.join(timeout=5.0)
