import json
import logging
import queue
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import List, Tuple

import numpy as np

from .engine import ServerlessEngine

logger = logging.getLogger(__name__)


class Server:
    """Platform-facing process: probes answer at once, traffic is accepted after the warm-up."""

    def __init__(self, engine_args: dict, port: int = 8080):
        self.engine_args = engine_args
        self.port = port
        self.engine: ServerlessEngine = None
        self.requests: "queue.Queue[Tuple[np.ndarray, np.ndarray, List[List[int]]]]" = queue.Queue()
        self.ready = threading.Event()

    def _boot(self) -> None:
        self.engine = ServerlessEngine(**self.engine_args)
        timings = self.engine.warm_up()
        logger.info("warm-up done: %s", json.dumps(timings))
        self.ready.set()

    def _loop(self) -> None:
        self.ready.wait()
        while True:
            tokens, seq_lens, pages = self.requests.get()
            batch = self.engine.make_batch(tokens, seq_lens, pages)
            self.engine.serve_step(batch)

    def handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path == "/healthz":
                    ok = server.engine is None or server.engine.health.live()
                    self.send_response(200 if ok else 503)
                elif self.path == "/ready":
                    ok = server.ready.is_set() and server.engine.health.ready()
                    self.send_response(200 if ok else 503)
                else:
                    self.send_response(404)
                self.end_headers()

        return Handler

    def run(self) -> None:
        threading.Thread(target=self._boot, daemon=True).start()
        threading.Thread(target=self._loop, daemon=True).start()
        ThreadingHTTPServer(("0.0.0.0", self.port), self.handler()).serve_forever()
