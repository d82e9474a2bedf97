"""The /metrics exporter: renders the registry and samples the device-side counters on scrape."""

from __future__ import annotations

import http.server
import threading
from typing import Dict

from mserve.attn import FlashInferBackend
from mserve.attn.wrapper_info import describe_pool, describe_wrapper

from .model_runner import ModelRunner


def dump_plan_stats(backend: FlashInferBackend) -> Dict[str, object]:
    """Scrape-time view of the last plan inputs; runs on the exporter thread."""
    return {
        "graph_buckets": sorted(backend.cuda_graph_wrappers),
        "eager_indptr_head": backend.eager_kv_indptr[:8].tolist(),  # ok: FC101
        "shadow_max_abs_err": float(backend.shadow_err),
        "pool": describe_pool(backend.pool),
        "eager_decode": describe_wrapper(backend.decode_wrapper),
    }


class MetricsExporter:
    def __init__(self, runner: ModelRunner, port: int):
        self.runner = runner
        self.port = port
        self.progress = runner.registry.gauge("max_request_progress", "largest sequence of the last step")
        self.slot_tokens = runner.registry.gauge("slot_tokens_max", "most tokens decoded in one slot")

    def scrape(self) -> str:
        m = self.runner.metrics
        self.slot_tokens.set(float(m.per_slot_tokens.max().item()))
        if m.last_seq_lens is not None:
            self.progress.set(float(m.last_seq_lens.max().item()))
        return self.runner.registry.render()

    def serve_background(self) -> threading.Thread:
        exporter = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = exporter.scrape().encode() if self.path == "/metrics" else b""
                self.send_response(200 if body else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()
                self.wfile.write(body)

        server = http.server.ThreadingHTTPServer(("0.0.0.0", self.port), Handler)
        t = threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True)
        t.start()
        return t
