"""Prometheus text endpoint; runs in its own thread, reads the registry and the backend."""

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from slo import MetricsRegistry
from slo_attn.backend import MeteredBackend


class MetricsExporter:
    def __init__(self, registry: MetricsRegistry, backend: MeteredBackend, port: int = 9400):
        self.registry = registry
        self.backend = backend
        self.port = port
        self.thread = None

    def collect_workspace_gauges(self) -> None:
        for bs, w in self.backend.graph_wrappers.items():
            nbytes = w._int_workspace_buffer.numel()  # expect: FC103
            self.registry.gauge(f'flashinfer_int_workspace_bytes{{bucket="{bs}"}}').set(nbytes)
        self.registry.gauge("flashinfer_float_workspace_bytes").set(self.backend.graph_ws.numel())

    def body(self) -> bytes:
        self.collect_workspace_gauges()
        return self.registry.render().encode()

    def start(self) -> None:
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                payload = exporter.body()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()
                self.wfile.write(payload)

        server = ThreadingHTTPServer(("0.0.0.0", self.port), Handler)
        self.thread = threading.Thread(target=server.serve_forever, daemon=True)
        self.thread.start()
