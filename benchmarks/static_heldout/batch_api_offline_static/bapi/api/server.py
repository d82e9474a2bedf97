"""The HTTP-facing side: create a batch from an uploaded JSONL file, report its status, write results."""
from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from typing import Callable, Dict, Optional

from bapi.config import OfflineConfig
from bapi.jobs import BatchJob, JobStore, read_jsonl


class HTTPError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class BatchAPIServer:
    def __init__(self, cfg: OfflineConfig, store: JobStore, run_job: Callable[[BatchJob], None]):
        self.cfg, self.store, self.run_job = cfg, store, run_job
        self._stop = threading.Event()
        self._worker = threading.Thread(target=self._drain, daemon=True)

    def create_batch(self, input_file: str) -> Dict[str, object]:
        requests = list(read_jsonl(input_file))
        if len(requests) > self.cfg.max_job_requests:
            raise HTTPError(413, f"{len(requests)} requests > max_job_requests={self.cfg.max_job_requests}")
        return self.describe(self.store.submit(requests))

    def describe(self, job: BatchJob) -> Dict[str, object]:
        return {
            "id": job.job_id,
            "status": job.status,
            "request_counts": {"total": len(job.requests), "completed": job.done},
            "storage": self.store._backend,  # ok: FC103
            "error": job.error,
        }

    def retrieve(self, job_id: str) -> Dict[str, object]:
        job = self.store.jobs.get(job_id)
        if job is None:
            raise HTTPError(404, f"no batch {job_id}")
        return self.describe(job)

    def write_results(self, job: BatchJob, path: Optional[str] = None) -> str:
        path = path or os.path.join(self.cfg.result_dir, f"{job.job_id}.jsonl")
        sink = contextlib.nullcontext(sys.stdout) if path == "-" else open(path, "w")
        with sink as f:
            for custom_id, tokens in job.results.items():
                f.write(json.dumps({"custom_id": custom_id, "output_ids": tokens}) + "\n")
        return path

    def start(self) -> None:
        self._worker.start()

    def _drain(self) -> None:
        while not self._stop.is_set():
            job = self.store.next_queued()
            if job is None:
                time.sleep(0.5)
                continue
            self.run_job(job)
            if job.status == "completed":
                self.write_results(job)
