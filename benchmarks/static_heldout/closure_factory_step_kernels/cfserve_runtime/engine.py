"""The engine: builds every per-step closure once, then routes each batch to the right one."""

from __future__ import annotations

import bisect
from typing import Callable, Optional, Sequence

import torch

from cfserve.attention import make_eager_decode_step, make_extend_fns, make_extend_step, make_trtllm_decode_step
from cfserve.batch import ForwardBatch
from cfserve.config import EOS_TOKEN_ID, EngineConfig
from cfserve.instrument import inference_step, make_step_stats, retry_on_oom, timed
from cfserve.kv_pool import PagePool, make_compactor, make_release_fn
from cfserve.model import DecoderModel
from cfserve.sampler import make_sampler
from cfserve.wrappers import eager_decode_wrapper, make_prefill_wrappers
from cfserve_runtime.graphs import GraphRunner


def pick_bucket(buckets: Sequence[int], n: int) -> Optional[int]:
    i = bisect.bisect_left(buckets, n)
    return buckets[i] if i < len(buckets) else None


class Engine:
    def __init__(self, cfg: EngineConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self._backend = "trtllm-gen" if cfg.use_trtllm_decode else "fa2"
        self.model = DecoderModel(cfg).to(device=device, dtype=cfg.dtype).eval()
        self.kv_caches = [
            torch.zeros(
                cfg.max_total_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim, dtype=cfg.dtype, device=device
            )
            for _ in range(cfg.num_layers)
        ]
        self.pool = PagePool(cfg.max_total_pages, cfg.page_size)
        self.req_to_token = torch.zeros(cfg.max_batch_size, cfg.max_pages_per_seq, dtype=torch.int32, device=device)
        self.runner = GraphRunner(cfg, self.model, self.kv_caches, device)

        if cfg.use_trtllm_decode:
            self.eager_decode = make_trtllm_decode_step(cfg, self.model, self.kv_caches, device)
        else:
            decode_wrapper = eager_decode_wrapper(device.index or 0, cfg.kv_layout, cfg.decode_workspace_bytes())
            self.eager_decode = make_eager_decode_step(
                cfg, self.model, self.kv_caches, decode_wrapper, self.runner.window_wrapper
            )
        ragged, paged = make_prefill_wrappers(cfg, device)
        prepare_extend, attend_extend = make_extend_fns(cfg, ragged, paged)
        self.extend_step = make_extend_step(self.model, self.kv_caches, prepare_extend, attend_extend)

        # one routing lambda per bucket; `bs=bs` pins the bucket at definition time
        self.steps: dict[int, Callable[[ForwardBatch], torch.Tensor]] = {}
        for bs in cfg.graph_buckets():
            self.steps[bs] = lambda batch, bs=bs: self.runner.replay(bs, batch)

        self.sample = self._make_sample_fn()
        self.record_step, self.step_report = make_step_stats()
        self.release = make_release_fn(self.pool, self.req_to_token, EOS_TOKEN_ID)
        self.compact = make_compactor(self.runner.bufs, self.kv_caches, self.req_to_token)
        self.next_ids_buf: Optional[torch.Tensor] = None
        self.token_host: Optional[torch.Tensor] = None
        self.token_ready = torch.cuda.Event()
        self.step_count = 0

    def warmup(self) -> None:
        self.runner.capture_all()

    def _make_sample_fn(self) -> Callable[[torch.Tensor, ForwardBatch], torch.Tensor]:
        sampler = make_sampler(self.cfg, self.device)

        def sample(logits: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
            n = batch.batch_size
            if self.next_ids_buf is None:
                self.next_ids_buf = torch.empty(self.cfg.max_batch_size, dtype=torch.int64, device=self.device)  # ok: FC107
            out = self.next_ids_buf[:n]
            out.copy_(sampler(logits, batch))
            if self.token_host is None or self.token_host.numel() < n:
                self.token_host = torch.empty(max(n, 256), dtype=torch.int64, pin_memory=True)  # ok: FC107
            self.token_host[:n].copy_(out, non_blocking=True)
            self.token_ready.record()
            batch.next_ids = out.clone()  # ok: FC107
            return out

        return sample

    @inference_step
    def step(self, batch: ForwardBatch) -> torch.Tensor:
        logits = self.extend(batch) if batch.is_extend else self.decode(batch)
        next_ids = self.sample(logits, batch)
        self.record_step(batch)
        self.release(batch, next_ids)
        self.step_count += 1
        if self.cfg.compact_every and self.step_count % self.cfg.compact_every == 0:
            remap = self.pool.build_remap(self.device)
            if remap is not None:
                self.compact(remap)
        return next_ids

    @timed("decode")
    def decode(self, batch: ForwardBatch) -> torch.Tensor:
        bs = pick_bucket(self.cfg.graph_buckets(), batch.batch_size)
        if bs is None:
            return self.eager_decode(batch)
        return self.steps[bs](batch)

    @retry_on_oom(times=2)
    def extend(self, batch: ForwardBatch) -> torch.Tensor:
        return self.extend_step(batch)

    def make_step_fn(self) -> Callable[[ForwardBatch], torch.Tensor]:
        """The closure the scheduler loop calls; keeps the scheduler unaware of the engine's class."""

        def step_fn(batch: ForwardBatch) -> torch.Tensor:
            return self.step(batch)

        return step_fn

    def stats(self) -> dict:
        return {
            "backend": self._backend,  # ok: FC103
            "kv_layout": self.runner._kv_layout,  # ok: FC103
            "steps": self.step_report(),
            "decode": self.decode.summary(),
            "replay": GraphRunner.replay.report(),
            "plans": self.runner.probe(),
        }

    def debug_state(self, bs: int) -> dict:
        return self.runner.dump(bs)
