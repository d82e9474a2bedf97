"""Graph bank whose bucket set follows the traffic: re-tune, tear down, build, warm up, record."""

import logging
from typing import Dict, List

import torch

from autotune.config import AutotuneConfig
from autotune.histogram import TrafficHistogram, choose_buckets, smooth_counts
from autotune.mempool import GraphMemoryPool
from autotune_rt.attention import BucketAttention, ChunkSpec
from autotune_rt.model import BucketDecoder

logger = logging.getLogger(__name__)


class Recapturer:
    def __init__(
        self,
        cfg: AutotuneConfig,
        model: BucketDecoder,
        attn: BucketAttention,
        hist: TrafficHistogram,
        dummy_chunk: ChunkSpec,
        device: torch.device,
    ):
        self.cfg = cfg
        self.model = model
        self.attn = attn
        self.hist = hist
        self.dummy_chunk = dummy_chunk
        self.device = device
        self.buckets: List[int] = sorted(cfg.initial_buckets)
        top = self.buckets[-1]
        self.static_input_ids = torch.zeros(top, dtype=torch.int64, device=self.device)
        self.static_chunk_ids = torch.zeros(cfg.chunk_tokens, dtype=torch.int64, device=self.device)
        self.static_seq_lens = torch.ones(top, dtype=torch.int32, device=self.device)
        self.static_logits = torch.empty((top, cfg.vocab_size), dtype=torch.bfloat16, device=self.device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.mempool = GraphMemoryPool()
        self._use_cuda_graph = True
        self.steps_since_tune = 0

    def _check_buckets(self) -> None:
        assert self.buckets == sorted(self.buckets), "bucket list must stay sorted"  # ok: FC109

    def bucket_for(self, n: int) -> int:
        for bs in self.buckets:
            if bs >= n:
                return bs
        return 0

    def record_bucket(self, bs: int) -> None:
        torch.cuda.synchronize()  # ok: FC101
        live = torch.nonzero(self.static_seq_lens[:bs])  # expect: FC101
        if live.shape[0] != bs:
            raise RuntimeError(f"bucket {bs}: static sequence lengths must be positive before capture")
        self.attn.ready_bucket(bs, self.dummy_chunk)
        for _ in range(2):  # warm-up: autotuned kernels pick their configs outside the capture
            self.model.forward_bucket(self.static_input_ids[:bs], self.static_chunk_ids, bs)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.mempool.handle):
            logits = self.model.forward_bucket(self.static_input_ids[:bs], self.static_chunk_ids, bs)
            self.static_logits[:bs].copy_(logits)
        self.graphs[bs] = g

    def record_all(self) -> None:
        for bs in reversed(self.buckets):
            self.record_bucket(bs)

    def replay_bucket(self, bs: int, n: int) -> torch.Tensor:
        self.graphs[bs].replay()
        return self.static_logits[:n]

    def maybe_retune(self) -> bool:
        self.steps_since_tune += 1
        if self.steps_since_tune < self.cfg.retune_every or not self._use_cuda_graph:  # ok: FC103
            return False
        self.steps_since_tune = 0
        peak = int(self.hist.counts_np.argmax())  # ok: FC101
        smoothed = smooth_counts(self.hist.counts_np, 3)
        new = choose_buckets(smoothed, self.cfg.num_buckets, self.cfg.max_batch)
        gain = self.hist.padded_waste(self.buckets) - self.hist.padded_waste(new)
        if gain < self.cfg.min_bucket_gain:
            return False

        # surviving buckets keep their graphs; only new sizes are captured
        new_max = new[-1]
        if new_max > self.static_logits.shape[0]:
            self.static_logits = torch.empty((new_max, self.cfg.vocab_size), dtype=torch.bfloat16, device=self.device)  # expect: FC107
        if new_max > self.static_input_ids.numel():
            self.static_input_ids.resize_(new_max)  # expect: FC107
        dropped = [bs for bs in self.buckets if bs not in new]
        added = [bs for bs in new if bs not in self.buckets]
        for bs in dropped:
            del self.graphs[bs]
            self.attn.teardown_bucket(bs)
        self.attn.reset_shared_buffers()
        self.mempool.renew()
        for bs in added:
            self.attn.build_bucket(bs)
            self.record_bucket(bs)
        self.buckets = sorted(new)
        self._check_buckets()
        logger.info("re-tuned buckets around peak batch %d: %s (gain %.3f)", peak, self.buckets, gain)
        return True
