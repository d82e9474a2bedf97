"""PyTorchModelEngine: wires the config tables into the components and runs one step per call."""

from __future__ import annotations

import logging
import os
from typing import Any, Dict, Optional

import torch

from nct_cfg.defaults import DEFAULT_CONFIG
from nct_cfg.loader import get_path, load_config
from nctllm.attn_op import FlashInferAttnOp
from nctllm.graph_runner import CUDAGraphRunner
from nctllm.kv_manager import KVCacheManager
from nctllm.metadata import FlashInferMetadataBuilder, ScheduledBatch
from nctllm.model import DecoderModel
from nctllm.options import AttnOptions
from nctllm.sampler import Sampler, SamplerOutput
from nctllm.trtllm_gen import TrtllmGenDecodeOp

logger = logging.getLogger(__name__)


class PyTorchModelEngine:
    def __init__(self, config_path: Optional[str] = None, model: Optional[str] = None):
        self.cfg = load_config(config_path, model)
        self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        self.opts = AttnOptions.from_config(self.cfg)
        self.hot_cfg = {**DEFAULT_CONFIG["hot_path"], **self.cfg.get("hot_path", {})}
        self.builder = FlashInferMetadataBuilder(self.cfg, self.device)
        self.attn_op = FlashInferAttnOp(self.cfg, self.opts, self.device)
        self.trt_op: Optional[TrtllmGenDecodeOp] = None
        if self.opts.decode_backend == "trtllm-gen":
            self.trt_op = TrtllmGenDecodeOp(self.cfg, self.opts, self.device)
        self.model = DecoderModel(self.cfg, self.attn_op, self.trt_op, self.device).to(self.device)
        self.kv_manager = KVCacheManager(self.cfg, self.attn_op, self.device)
        self.sampler = Sampler(self.cfg, self.device)
        self.graph_runner: Optional[CUDAGraphRunner] = None
        if get_path(self.cfg, "cuda_graph.enabled", True):
            self.graph_runner = CUDAGraphRunner(
                self.cfg, self.model, self.attn_op, self.builder, self.sampler, self.device
            )
        self.step_id = 0

    def warmup(self) -> None:
        if self.graph_runner is not None:
            self.graph_runner.record_graphs()

    @torch.inference_mode()
    def forward_step(self, batch: ScheduledBatch) -> SamplerOutput:
        self.step_id += 1
        meta = self.builder.build(batch)
        inputs = self.builder.stage_inputs(batch, meta)
        self.sampler.prepare(batch)
        self.kv_manager.plan(meta.seq_lens, kv_indptr=meta.kv_indptr_gpu)  # ok: FC102
        self.kv_manager.maybe_compact(self.step_id, meta.num_kv_pages)
        next_tokens = None
        runner = self.graph_runner
        if runner is not None and meta.num_prefills == 0 and meta.batch_size in runner.batch_sizes:  # ok: FC101
            next_tokens = runner.replay(meta, inputs)
        if next_tokens is None:
            self.attn_op.prepare(meta)
            logits = self.model(inputs.input_ids, inputs.positions, meta)
            next_tokens = self.sampler.sample(logits, meta.batch_size)
        out = self.sampler.finalize(next_tokens)
        if self.hot_cfg.get("log_lengths", False):
            logger.debug("step %d: %d rows, lens=%s", self.step_id, meta.batch_size, meta.seq_lens)
        return out

    def set_shared_prefix(self, page_ids: list, prefix_len: int) -> None:
        """Pin the system-prompt pages every request shares (``attention.shared_prefix_pages``)."""
        ps = self.opts.page_size
        bs = self.cfg.get("scheduler", {}).get("max_batch_size", 64)
        qo_indptr_cpu = torch.arange(bs + 1, dtype=torch.int32)
        prefix_indptr_cpu = torch.arange(bs + 1, dtype=torch.int32) * len(page_ids)
        prefix_indices = torch.tensor(page_ids * bs, dtype=torch.int32, device=self.device)
        last_cpu = torch.full((bs,), prefix_len - (len(page_ids) - 1) * ps, dtype=torch.int32)
        self.attn_op.plan_shared_prefix(qo_indptr_cpu, prefix_indptr_cpu, prefix_indices, last_cpu)

    def dump_state(self) -> Dict[str, Any]:
        """Admin endpoint: snapshot of the attention op's page list and workspace usage."""
        return {
            "kv_indices": self.attn_op.kv_indices.cpu(),  # ok: FC101
            "workspaces": self.attn_op.workspace_usage(),
            "config": self.cfg,
        }
