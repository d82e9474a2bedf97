"""The model runner: one ``step`` per scheduler iteration.

Decode batches that fit a bucket replay that bucket's graph; speculative batches replay a
verify graph; everything else runs eagerly on the prototype wrappers.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from typing import List, Optional, Tuple

import torch

from protoserve.attention.backend import FlashInferEagerBackend
from protoserve.attention.wrappers import DecodeWrapperSet
from protoserve.buffers import DecodeBuffers, private_copy
from protoserve.config import EngineConfig
from protoserve.graph_runner import BucketGraphRunner, VerifyGraphRunner
from protoserve.metadata import (
    ScheduledBatch,
    SharedPrefixInfo,
    StepMetadata,
    derive_eager_meta,
    fill_host_mirrors,
    for_bucket,
    host_view,
)
from protoserve.model import TinyDecoder
from protoserve.runner_pool import RunnerPool
from protoserve.sampler import Sampler, SamplingState
from protoserve_kernels.trtllm_decode import TrtllmDecodeKernel

logger = logging.getLogger(__name__)


class ModelRunner:
    def __init__(
        self,
        cfg: EngineConfig,
        model: TinyDecoder,
        kv_caches: List[torch.Tensor],
        device: Optional[torch.device] = None,
    ):
        self.cfg = cfg
        self.device = torch.device(device or cfg.device)
        self.model = model
        self.kv_caches = kv_caches
        self.wrappers = DecodeWrapperSet(cfg, self.device)
        bufs = DecodeBuffers(cfg.max_batch_size, cfg.max_pages_per_step, self.device)
        self.trtllm = TrtllmDecodeKernel(cfg, self.device) if cfg.use_trtllm_decode else None
        self.proto = BucketGraphRunner(cfg, model, kv_caches, bufs, self.wrappers, self.trtllm, self.device)
        self.verify_proto: Optional[VerifyGraphRunner] = None
        if cfg.num_speculative_tokens:
            self.verify_proto = VerifyGraphRunner(
                cfg, model, kv_caches, copy.copy(bufs), self.wrappers, self.trtllm, self.device
            )
        self.meta_template = self.proto.meta_template
        # eager steps plan from buffers of their own
        self.eager_bufs = private_copy(bufs)
        # the draft worker reads next step's page table from here
        self.draft_bufs = copy.deepcopy(bufs)
        # the KV offloader reads the page ids it must load back for the next step from here
        self.prefetch_bufs = copy.copy(bufs)
        self.backend = FlashInferEagerBackend(cfg, self.wrappers, self.eager_bufs, self.device)
        self.sampling = SamplingState(cfg.max_batch_size, self.device)
        self.sampler = Sampler(cfg, self.device)
        self.copy_stream = torch.cuda.Stream(self.device)
        self.tokens_ready = torch.cuda.Event()
        self.host_tokens = torch.empty(cfg.max_batch_size, dtype=torch.int64, pin_memory=True)
        k1 = cfg.num_speculative_tokens + 1
        self.verify_qo_indptr_cpu = torch.arange(0, (cfg.max_batch_size + 1) * k1, k1, dtype=torch.int32)
        self.verify_qo_indptr = self.verify_qo_indptr_cpu.to(self.device)
        self.last_idx_buf: Optional[torch.Tensor] = None
        self.shared_prefix: Optional[SharedPrefixInfo] = None
        self.pool: Optional[RunnerPool] = None
        self.offloader = None

    def init_cuda_graphs(self) -> None:
        self.pool = RunnerPool(self.cfg, self.proto, self.verify_proto)
        self.pool.build()
        self.pool.record_all()

    def set_shared_prefix(self, prefix: Optional[SharedPrefixInfo]) -> None:
        self.shared_prefix = prefix

    # -- the step --------------------------------------------------------------------------

    @torch.inference_mode()
    def step(self, batch: ScheduledBatch) -> Optional[List[int]]:
        num_tokens = int(batch.input_ids.shape[0])  # ok: FC101
        bs = batch.batch_size
        fits = self.pool is not None and bs <= self.pool.max_bucket
        if fits and batch.num_draft_tokens and self.verify_proto is not None:
            logits, meta = self._verify_graph_step(batch)
        elif fits and batch.is_decode:
            logits, meta = self._decode_graph_step(batch)
        else:
            logits, meta = self._eager_step(batch, num_tokens)
        next_tokens = self.sampler.sample(logits, self.sampling, meta)
        if self.cfg.overlap_schedule:
            self._publish_async(next_tokens, bs)
            return None
        return next_tokens.tolist()  # expect: FC101

    def _decode_graph_step(self, batch: ScheduledBatch) -> Tuple[torch.Tensor, StepMetadata]:
        bs = batch.batch_size
        bucket = self.pool.bucket_for(bs)
        runner = self.pool.get(bucket)
        meta = for_bucket(runner.meta_template, bs, bucket)
        fill_host_mirrors(meta, batch, self.cfg.page_size)
        meta.page_ids = batch.page_ids.clone() if self.cfg.overlap_schedule else batch.page_ids  # ok: FC107
        meta.prefix = self.shared_prefix
        snap = host_view(meta)
        if int(snap.seq_lens[:bs].max()) >= self.cfg.max_context_len:  # ok: FC101
            raise ValueError(f"a request reached max_context_len={self.cfg.max_context_len}")
        if self.cfg.overlap_schedule and runner.input_ids.data_ptr() == self.proto.input_ids.data_ptr():
            runner.privatize_inputs()
        with torch.cuda.stream(self.copy_stream):
            runner.load_inputs(batch.input_ids, batch.positions)
        torch.cuda.current_stream().wait_stream(self.copy_stream)  # ok: FC101
        if self.trtllm is not None:
            self.trtllm.load_block_tables(batch.page_ids.view(bs, -1), bs)
        runner.load_step(meta)
        if batch.next_page_ids is not None:
            self._stage_prefetch(batch.next_page_ids)
        logger.debug("replay bucket %d for %d rows, seq_lens=%s", bucket, bs, meta.seq_lens)  # ok: FC101
        return runner.replay()[:bs], meta

    def _verify_graph_step(self, batch: ScheduledBatch) -> Tuple[torch.Tensor, StepMetadata]:
        bs = batch.batch_size
        bucket = self.pool.bucket_for(bs)
        runner = self.pool.get_verify(bucket)
        k1 = self.cfg.num_speculative_tokens + 1
        meta = dataclasses.replace(
            for_bucket(runner.meta_template, bs, bucket),
            qo_indptr=self.verify_qo_indptr[: bucket + 1],
            qo_indptr_cpu=self.verify_qo_indptr_cpu[: bucket + 1],
            page_ids=batch.page_ids,
        )
        fill_host_mirrors(meta, batch, self.cfg.page_size)
        runner.load_inputs(batch.input_ids, batch.positions)
        runner.load_step(meta)
        if meta.seq_lens[:bs].max() + k1 > self.cfg.max_context_len:  # expect: FC101
            raise ValueError(f"verify rows would pass max_context_len={self.cfg.max_context_len}")
        self._stage_draft_pages(batch)
        logits = runner.replay()[: bucket * k1].view(bucket, k1, -1)
        # bonus-token logits; the spec worker accepts drafts on the full tensor it keeps
        return logits[:bs, -1], meta

    def _eager_step(self, batch: ScheduledBatch, num_tokens: int) -> Tuple[torch.Tensor, StepMetadata]:
        meta = derive_eager_meta(self.meta_template, batch, self.eager_bufs, self.device)
        fill_host_mirrors(meta, batch, self.cfg.page_size)
        # the previous step's prefetch copies must land before the eager plan reads the pages
        self.copy_stream.synchronize()  # expect: FC101
        self.backend.init_forward_metadata(meta)
        attn = self.backend.context(meta)
        logits = self.model(batch.input_ids, batch.positions, self.kv_caches, attn)
        if meta.qo_indptr is None:
            return logits, meta
        if self.last_idx_buf is None:
            self.last_idx_buf = torch.zeros(self.cfg.max_batch_size, dtype=torch.int64, device=self.device)  # ok: FC107
        idx = self.last_idx_buf[: meta.batch_size]
        torch.sub(meta.qo_indptr[1:], 1, out=idx)
        logger.debug("eager step: %d tokens, %d rows", num_tokens, meta.batch_size)
        return logits.index_select(0, idx), meta

    # -- side buffers ----------------------------------------------------------------------

    def _stage_prefetch(self, next_page_ids: torch.Tensor) -> None:
        n = next_page_ids.numel()
        with torch.cuda.stream(self.copy_stream):
            self.prefetch_bufs.kv_indices[:n].copy_(next_page_ids, non_blocking=True)  # expect: FC104
        if self.offloader is not None:
            self.offloader.schedule_load(self.prefetch_bufs.kv_indices[:n], self.copy_stream)

    def _stage_draft_pages(self, batch: ScheduledBatch) -> None:
        n = batch.page_ids.numel()
        self.draft_bufs.kv_indices[:n].copy_(batch.page_ids, non_blocking=True)  # ok: FC104
        self.draft_bufs.kv_indptr_cpu[: batch.batch_size + 1] = self.meta_template.kv_indptr_cpu[
            : batch.batch_size + 1
        ]

    def _publish_async(self, next_tokens: torch.Tensor, bs: int) -> None:
        """Overlap schedule: the scheduler reads ``host_tokens`` after ``tokens_ready``."""
        if self.host_tokens.numel() < bs:
            self.host_tokens = torch.empty(2 * bs, dtype=torch.int64, pin_memory=True)  # ok: FC107
        self.host_tokens[:bs].copy_(next_tokens, non_blocking=True)  # ok: FC101
        self.tokens_ready.record()
