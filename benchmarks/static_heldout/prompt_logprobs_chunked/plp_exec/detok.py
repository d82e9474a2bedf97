"""Detokenizer thread: waits for each copy's event, then reads the pinned buffers."""

import queue
import threading
from typing import Dict, List, Optional, Tuple

import torch

from plp.collector import PromptLogprobCollector
from plp.requests import LogprobRequest


class DetokenizerThread(threading.Thread):
    def __init__(self, tokenizer, collector: PromptLogprobCollector, requests: Dict[int, LogprobRequest]):
        super().__init__(name="detokenizer", daemon=True)
        self.tokenizer = tokenizer
        self.collector = collector
        self.requests = requests
        self.jobs: "queue.Queue[Optional[Tuple]]" = queue.Queue()
        self.text: Dict[int, List[str]] = {}

    def submit_logprobs(self, event: torch.cuda.Event, n: int, spans: Dict[int, Tuple[int, int]]) -> None:
        self.jobs.put(("logprobs", event, n, spans))

    def submit_tokens(self, event: torch.cuda.Event, tokens_pinned: torch.Tensor, req_ids: List[int]) -> None:
        self.jobs.put(("tokens", event, tokens_pinned, req_ids))

    def run(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            kind, event = job[0], job[1]
            event.synchronize()
            if kind == "logprobs":
                self._logprobs(job[2], job[3])
            else:
                self._tokens(job[2], job[3])

    def _logprobs(self, n: int, spans: Dict[int, Tuple[int, int]]) -> None:
        lp = self.collector.host_logprobs[:n].tolist()  # ok: FC101
        ids = self.collector.host_ids[:n].tolist()
        for rid, (a, b) in spans.items():
            req = self.requests[rid]
            req.prompt_logprobs.extend(row[0] for row in lp[a:b])
            req.prompt_top_ids.extend(ids[a:b])
        self.collector.retire()

    def _tokens(self, tokens_pinned: torch.Tensor, req_ids: List[int]) -> None:
        toks = tokens_pinned[: len(req_ids)].tolist()
        for rid, t in zip(req_ids, toks):
            self.requests[rid].output_ids.append(t)
            self.text.setdefault(rid, []).append(self.tokenizer.decode([t]))
