"""The table of bucket runners: cloned from the prototypes, then recorded into one graph pool."""

from __future__ import annotations

import bisect
import logging
from typing import Dict, List, Optional

import torch

from protoserve.config import DEFAULT_BUCKETS, EngineConfig
from protoserve.graph_runner import BucketGraphRunner, VerifyGraphRunner

logger = logging.getLogger(__name__)


class RunnerPool:
    def __init__(
        self,
        cfg: EngineConfig,
        proto: BucketGraphRunner,
        verify_proto: Optional[VerifyGraphRunner] = None,
    ):
        assert DEFAULT_BUCKETS == tuple(sorted(DEFAULT_BUCKETS))  # ok: FC109
        self.cfg = cfg
        self.proto = proto
        self.verify_proto = verify_proto
        self.buckets: List[int] = sorted(b for b in cfg.cuda_graph_buckets if b <= cfg.max_batch_size)
        self.runners: Dict[int, BucketGraphRunner] = {}
        self.verify_runners: Dict[int, VerifyGraphRunner] = {}
        self.graph_pool = None

    @property
    def max_bucket(self) -> int:
        return self.buckets[-1]

    def bucket_for(self, bs: int) -> int:
        i = bisect.bisect_left(self.buckets, bs)
        if i == len(self.buckets):
            raise ValueError(f"batch of {bs} is above the largest bucket {self.max_bucket}")
        return self.buckets[i]

    def build(self) -> None:
        """Clone the prototypes, largest bucket first (smaller ones may reuse its wrapper)."""
        for bs in sorted(self.buckets, reverse=True):
            runner = self.proto.for_bucket(bs)
            runner.init_graph_buffers()
            self.runners[bs] = runner
            if self.verify_proto is not None:
                self.verify_runners[bs] = self.verify_proto.for_bucket(bs)
        shared = sum(r.bufs.shares_storage_with(self.proto.bufs) for r in self.runners.values())
        logger.info("built %d bucket runners (%d share the prototype's buffers)", len(self.runners), shared)

    def record_all(self) -> None:
        stream = torch.cuda.Stream()
        for bs in reversed(self.buckets):
            for table in (self.runners, self.verify_runners):
                runner = table.get(bs)
                if runner is None:
                    continue
                self.graph_pool = runner.capture(self.graph_pool, stream)
        torch.cuda.synchronize()

    def get(self, bucket: int) -> BucketGraphRunner:
        assert bucket in self.runners, f"bucket {bucket} was not captured"  # expect: FC109
        return self.runners[bucket]

    def get_verify(self, bucket: int) -> VerifyGraphRunner:
        runner = self.verify_runners.get(bucket)
        if runner is None:
            raise KeyError(f"no verify graph for bucket {bucket}")
        return runner
