"""Batch jobs: JSONL files of requests, stored until a runner drains them in static batches."""
from __future__ import annotations

import itertools
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional

from bapi.config import OfflineConfig


@dataclass
class BatchJob:
    job_id: str
    requests: List[dict]
    status: str = "queued"
    results: Dict[str, List[int]] = field(default_factory=dict)
    created_at: float = field(default_factory=time.time)
    error: Optional[str] = None

    @property
    def done(self) -> int:
        return len(self.results)


def read_jsonl(path: str) -> Iterator[dict]:
    with open(path) as f:
        for line_no, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            req = json.loads(line)
            if "prompt_ids" not in req:
                raise ValueError(f"{path}:{line_no}: request without prompt_ids")
            req.setdefault("custom_id", f"line-{line_no}")
            yield req


class JobStore:
    def __init__(self, cfg: OfflineConfig, backend: str = "memory"):
        self.cfg = cfg
        self._backend = backend
        self.jobs: Dict[str, BatchJob] = {}

    def submit(self, requests: List[dict]) -> BatchJob:
        assert len(requests) <= self.cfg.max_job_requests  # expect: FC109
        job = BatchJob(job_id=f"batch_{uuid.uuid4().hex[:16]}", requests=requests)
        self.jobs[job.job_id] = job
        return job

    def next_queued(self) -> Optional[BatchJob]:
        return next((j for j in self.jobs.values() if j.status == "queued"), None)

    def static_batches(self, job: BatchJob) -> Iterator[List[dict]]:
        """Requests sorted by prompt length, cut into batches of ``batch_rows``: rows of one batch pad alike."""
        ordered = sorted(job.requests, key=lambda r: len(r["prompt_ids"]))
        it = iter(ordered)
        while chunk := list(itertools.islice(it, self.cfg.batch_rows)):
            yield chunk
