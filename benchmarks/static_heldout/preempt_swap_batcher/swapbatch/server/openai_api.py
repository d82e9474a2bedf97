"""An OpenAI-style completions front end over the batcher: one loop thread runs step / finish_step."""
from __future__ import annotations

import queue
import threading
import time
import uuid
from typing import Dict, Iterator, List, Optional

from swapbatch.engine import ContinuousBatcher


class OpenAIServer:
    def __init__(self, engine: ContinuousBatcher, tokenizer) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.inbox: "queue.Queue[tuple]" = queue.Queue()
        self.streams: Dict[int, "queue.Queue[Optional[dict]]"] = {}
        self._stop = threading.Event()
        self._loop = threading.Thread(target=self.serve_forever, daemon=True)

    def start(self) -> None:
        self._loop.start()

    def create_completion(self, body: dict) -> Iterator[dict]:
        """POST /v1/completions with ``stream: true``."""
        prompt_ids = self.tokenizer.encode(body["prompt"])
        out: "queue.Queue[Optional[dict]]" = queue.Queue()
        self.inbox.put((prompt_ids, int(body.get("max_tokens", 256)), float(body.get("temperature", 1.0)), out))
        rid = f"cmpl-{uuid.uuid4().hex}"
        while True:
            item = out.get()
            if item is None:
                return
            yield {
                "id": rid,
                "object": "text_completion",
                "created": int(time.time()),
                "choices": [{"index": 0, "text": item["text"], "finish_reason": item["finish_reason"]}],
            }

    def serve_forever(self) -> None:
        while not self._stop.is_set():
            self._drain_inbox()
            handle = self.engine.step()
            if handle is None:
                time.sleep(0.001)
                continue
            for seq_id, token, finished in self.engine.finish_step(handle):
                stream = self.streams.get(seq_id)
                if stream is None:
                    continue
                stream.put({"text": self.tokenizer.decode([token]), "finish_reason": "stop" if finished else None})
                if finished:
                    stream.put(None)
                    del self.streams[seq_id]

    def _drain_inbox(self) -> None:
        while True:
            try:
                prompt_ids, max_tokens, temperature, out = self.inbox.get_nowait()
            except queue.Empty:
                return
            seq_id = self.engine.add_request(prompt_ids, max_tokens, temperature)
            self.streams[seq_id] = out

    def metrics(self) -> Dict[str, float]:
        """GET /metrics, served from the HTTP thread."""
        engine = self.engine
        running = len(engine.scheduler.running)
        swapped = len(engine.scheduler.swapped)
        ws = vars(engine.backend.decode_wrapper)["_float_workspace_buffer"].numel()  # expect: FC103
        mean_len = engine.seq_lens_dev[: max(running, 1)].float().mean().item()  # ok: FC101
        return {
            "num_running": running,
            "num_swapped": swapped,
            "num_free_gpu_blocks": len(engine.block_manager.free_gpu),
            "num_free_cpu_blocks": len(engine.block_manager.free_cpu),
            "mean_running_len": mean_len,
            "flashinfer_workspace_bytes": ws,
        }

    def server_info(self) -> Dict[str, str]:
        return {"attention_backend": self.engine.backend._backend, "graph_buckets": str(self.engine.graphs.buckets)}  # ok: FC103
