import logging
import time
from typing import Dict, List, Optional

import numpy as np
import torch

import flashcheck
from coldstart import ConfigClient, HealthChecker

from .batch import StepBatch
from .graph_cache import OnDemandGraphCache
from .lazy_backend import LazyFlashInferBackend
from .model import ServerlessLM

logger = logging.getLogger(__name__)


class ServerlessEngine:
    def __init__(self, model_id: str, config_url: str, device: str = "cuda", layers: int = 16, heads: int = 16,
                 kv_heads: int = 4, head_dim: int = 128, page_size: int = 16, num_pages: int = 8192):
        self.device = device
        self.config_client = ConfigClient(config_url)
        self.ws_plan = self.config_client.fetch_plan(model_id, timeout_s=0.5)
        max_batch = self.ws_plan.max_batch if self.ws_plan is not None else 32
        buckets = list(self.ws_plan.warm_buckets) if self.ws_plan is not None else [1, 8]
        self.backend = LazyFlashInferBackend(heads, kv_heads, head_dim, page_size, num_pages, max_batch, device,
                                             self.ws_plan)
        self.backend.init_graph_buffers()
        self.model = ServerlessLM(layers, heads * head_dim, heads, head_dim, 32000, self.backend).to(device)
        self.kv_cache = torch.zeros(layers, num_pages, 2, page_size, kv_heads, head_dim, dtype=torch.bfloat16,
                                    device=device)
        self.graphs = OnDemandGraphCache(self.model, self.backend, self.kv_cache, sorted(set(buckets + [max_batch])))
        self.health = HealthChecker(max_step_ms=50.0, warm_buckets_needed=len(buckets))
        self.logits_buf = torch.zeros(max_batch, 32000, dtype=torch.float32, device=device)
        self._static_logits: Optional[torch.Tensor] = None
        logger.info("engine up; config via %s", self.config_client._backend)  # ok: FC103

    def make_batch(self, tokens_np: np.ndarray, seq_lens_np: np.ndarray, pages: List[List[int]]) -> StepBatch:
        counts = np.array([len(p) for p in pages], dtype=np.int32)
        indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
        last = ((seq_lens_np - 1) % self.backend.page_size + 1).astype(np.int32)
        flat = np.fromiter((x for p in pages for x in p), dtype=np.int32)
        d = self.device
        return StepBatch(
            bs=len(pages),
            tokens=torch.from_numpy(tokens_np).to(d, non_blocking=True),
            positions=torch.from_numpy(seq_lens_np - 1).to(d, non_blocking=True),
            seq_lens=torch.from_numpy(seq_lens_np).to(d, non_blocking=True),
            seq_lens_cpu=torch.from_numpy(seq_lens_np),
            kv_indptr=torch.from_numpy(indptr).to(d, non_blocking=True),
            kv_indptr_cpu=torch.from_numpy(indptr),
            kv_indices=torch.from_numpy(flat).to(d, non_blocking=True),
            kv_last_page_len_cpu=torch.from_numpy(last),
        )

    @flashcheck.hot_path
    def serve_step(self, batch: StepBatch) -> torch.Tensor:
        started = time.perf_counter()
        n_tokens = int(batch.seq_lens.sum())  # expect: FC101
        n_tokens_host = int(batch.seq_lens_cpu.sum())  # ok: FC101
        if n_tokens_host != n_tokens:
            logger.warning("host and device lengths disagree")
        padded = self.graphs.bucket_for(batch.bs)
        if padded is None:
            self.backend.plan_eager(batch)
            logits = self.model(batch.tokens, self.kv_cache, batch.bs)
        elif padded in self.graphs.entries:
            logits = self.graphs.replay(batch, padded)
        elif len(self.graphs.entries) < self.graphs.max_graphs:
            entry = self.graphs.capture_bucket(batch, padded)
            self.health.warm_buckets += 1
            logits = entry.logits[: batch.bs]
        else:
            self.backend.plan_eager(batch)
            logits = self.model(batch.tokens, self.kv_cache, batch.bs)
        if self._static_logits is None:
            self._static_logits = torch.empty_like(self.logits_buf)  # ok: FC107
        self.logits_buf[: batch.bs].copy_(logits)
        self.health.record_step(started, self.logits_buf[: batch.bs])
        if not self.health.gpu_idle():
            logger.debug("step %d tokens queued behind the previous one", n_tokens_host)
        return self.logits_buf[: batch.bs]

    def warm_up(self, steps: int = 3) -> Dict[str, float]:
        """Runs the first buckets on dummy requests before the platform routes traffic here."""
        timings = {}
        for bs in self.graphs.buckets[: self.health.warm_buckets_needed]:
            seq = np.full(bs, 17, dtype=np.int64)
            pages = [[i] + [i + bs] for i in range(bs)]
            batch = self.make_batch(np.zeros(bs, dtype=np.int64), seq, pages)
            for _ in range(steps):
                t0 = time.perf_counter()
                out = self.serve_step(batch)
                torch.cuda.synchronize()
                timings[f"bs{bs}"] = (time.perf_counter() - t0) * 1e3
            peak = out.abs().max().item()  # ok: FC101
            logger.info("warm bucket %d: %.1f ms, |logit| max %.1f", bs, timings[f"bs{bs}"], peak)
        # leave the graph page list pointing at the null page for the first real request
        self.backend.graph_indices.fill_(0)  # expect: FC104
        logger.info("workspaces: %s", self.backend.workspace_report())
        return timings
