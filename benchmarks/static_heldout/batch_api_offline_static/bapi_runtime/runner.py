"""Drains jobs: pads each static batch, prefills it (graph or eager), decodes every row to the limit."""
from __future__ import annotations

import logging
from typing import Dict, List

import torch

from bapi.config import OfflineConfig
from bapi.jobs import BatchJob, JobStore
from bapi.padding import bucket_for, pad_batch
from bapi_runtime.attention import OfflineAttention
from bapi_runtime.graphs import PaddedGraphCache
from bapi_runtime.metadata import StaticBatchMetadataBuilder
from bapi_runtime.model import OfflineLM

logger = logging.getLogger(__name__)


class OfflineRunner:
    def __init__(self, cfg: OfflineConfig, device: torch.device, store: JobStore):
        self.cfg, self.device, self.store = cfg, device, store
        self.attn = OfflineAttention(cfg, device)
        self.model = OfflineLM(cfg).to(device)
        n_pages = cfg.batch_rows * cfg.pages_per_row
        shape = (n_pages, 2, cfg.num_kv_heads, cfg.page_size, cfg.head_dim)
        self.kv_cache = [torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(cfg.num_layers)]
        self.builder = StaticBatchMetadataBuilder(cfg, device)
        self.graphs = PaddedGraphCache(self.model, self.attn, self.kv_cache, cfg, device)
        self.out_tokens = torch.zeros(cfg.batch_rows, cfg.max_new_tokens, dtype=torch.int64, device=device)
        self._plan_info: Dict[str, int] = {}

    @torch.inference_mode()
    def warmup(self) -> None:
        self.graphs.capture_all()

    def _admit_static_batch(self, rows: int) -> None:
        # the page table of a static batch never changes: stage it once where the prefill graphs read it
        ppr = self.cfg.pages_per_row
        self.attn.kv_indices[: rows * ppr].copy_(self.attn.block_tables[:rows].flatten())  # expect: FC104

    def _reset_mirrors(self) -> None:
        for host, dev in zip(self.attn.host_mirrors, self.attn.bound_buffers):
            if host.numel() != dev.numel():
                raise RuntimeError(f"host mirror of {host.numel()} entries for a buffer of {dev.numel()}")
            host.zero_()  # ok: FC104

    @torch.inference_mode()
    def _run_static_batch(self, reqs: List[dict]) -> Dict[str, List[int]]:
        prompts = [r["prompt_ids"] for r in reqs]
        longest = max(len(p) for p in prompts)
        L = bucket_for(longest, self.cfg.padded_lengths)
        ids_np, lens_np = pad_batch(prompts, L or longest)
        rows = len(prompts)
        self._reset_mirrors()
        self._admit_static_batch(rows)
        md = self.builder.build(ids_np, lens_np, L)
        self.attn.init_forward_metadata(md)
        self._plan_info = {"rows": rows, "padded_len": L or -1, "tokens": md.num_tokens_host}  # ok: FC103
        if L is not None:
            logits = self.graphs.replay(L, md)
        else:
            last_idx = (md.qo_indptr[1:] - 1).long()
            logits = self.model.prefill_forward(md.input_ids, md.positions, self.attn, self.kv_cache, last_idx)
        next_ids = logits.argmax(-1)
        for step in range(self.cfg.max_new_tokens):
            self.out_tokens[:rows, step].copy_(next_ids)
            dmd = self.builder.build_decode(md, step)
            self.attn.init_forward_metadata_decode(dmd)
            next_ids = self.graphs.replay_decode(dmd, next_ids).argmax(-1)
        # one device-to-host copy per static batch, after its last decode step
        tokens = self.out_tokens[:rows].tolist()  # ok: FC101
        return {r["custom_id"]: t for r, t in zip(reqs, tokens)}

    def run_job(self, job: BatchJob) -> None:
        job.status = "in_progress"
        try:
            for batch in self.store.static_batches(job):
                job.results.update(self._run_static_batch(batch))
        except Exception as exc:  # a failed batch fails the job, the server keeps going
            job.status, job.error = "failed", repr(exc)
            logger.exception("job %s failed", job.job_id)
            return
        job.status = "completed"
