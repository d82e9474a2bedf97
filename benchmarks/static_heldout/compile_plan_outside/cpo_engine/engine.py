"""The engine loop: plan outside, run the compiled (CUDA-graph) forward, sample."""
from __future__ import annotations

import dataclasses
import logging
from typing import List, Optional

import numpy as np
import torch

from cpo_engine.config import EngineConfig
from cpo_engine.metadata import AttnStepMetadata, CommonAttentionMetadata, FlashInferMetadataBuilder
from cpo_engine.model import LlamaForCausalLM
from cpo_engine.ops.attention_ops import install_kv_caches

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class SchedulerOutput:
    req_ids: List[str]
    input_ids_cpu: torch.Tensor
    positions_cpu: torch.Tensor
    query_start_loc_cpu: torch.Tensor
    seq_lens_cpu: torch.Tensor
    block_table_cpu: torch.Tensor
    slot_mapping_cpu: torch.Tensor
    num_scheduled_tokens_np: np.ndarray
    # decode steps the scheduler guarantees stay inside the current pages (no new plan needed)
    decode_only_steps: int = 0


@dataclasses.dataclass
class StepInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    common: CommonAttentionMetadata


class CompiledEngine:
    _STATIC_INPUT_NAMES = ("input_ids", "positions")

    def __init__(self, cfg: EngineConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.model = LlamaForCausalLM(cfg).to(device)
        self.builder = FlashInferMetadataBuilder(cfg, cfg.kv_spec, device)
        self.builder.init_graph_buffers()
        spec = cfg.kv_spec
        shape = (spec.num_blocks, spec.page_size, spec.num_kv_heads, spec.head_dim)
        install_kv_caches(
            [(torch.zeros(shape, dtype=torch.bfloat16, device=device), torch.zeros(shape, dtype=torch.bfloat16, device=device)) for _ in range(cfg.num_layers)]
        )
        self.compiled = torch.compile(self.model, mode="reduce-overhead", fullgraph=True, dynamic=False)
        self.input_ids = torch.zeros(cfg.max_num_batched_tokens, dtype=torch.int64, device=device)
        self.positions = torch.zeros(cfg.max_num_batched_tokens, dtype=torch.int64, device=device)
        self.sampled_host = torch.empty(cfg.max_num_seqs, dtype=torch.int64, pin_memory=True)
        self.sampled_ready = torch.cuda.Event()
        self._logits_scratch: Optional[torch.Tensor] = None
        logger.info("attention KV layout %s", self.builder._kv_layout)  # ok: FC103
        self.capture_sizes()
        self.check_graph_wrappers()

    # ------------------------------------------------------------------ per step
    def _prepare_inputs(self, sched: SchedulerOutput) -> StepInputs:
        dev = self.device
        common = CommonAttentionMetadata(
            num_reqs=len(sched.req_ids),
            num_actual_tokens=int(sched.num_scheduled_tokens_np.sum()),  # ok: FC101
            query_start_loc=sched.query_start_loc_cpu.to(dev, non_blocking=True),
            query_start_loc_cpu=sched.query_start_loc_cpu,
            seq_lens=sched.seq_lens_cpu.to(dev, non_blocking=True),
            seq_lens_cpu=sched.seq_lens_cpu,
            block_table=sched.block_table_cpu.to(dev, non_blocking=True),
            slot_mapping=sched.slot_mapping_cpu.to(dev, non_blocking=True),
        )
        return StepInputs(sched.input_ids_cpu.to(dev, non_blocking=True), sched.positions_cpu.to(dev, non_blocking=True), common)

    def step(self, sched: SchedulerOutput) -> torch.cuda.Event:
        if max(sched.num_scheduled_tokens_np.tolist()) > self.cfg.max_num_batched_tokens:  # ok: FC101
            raise ValueError("one request was scheduled more tokens than the step budget")
        batch = self._prepare_inputs(sched)
        md = self.builder.build(batch.common)
        n = md.padded_tokens
        pad = n - batch.common.num_actual_tokens
        for name in self._STATIC_INPUT_NAMES:
            src = getattr(batch, name)
            setattr(self, name, torch.cat([src, src.new_zeros(pad)]))  # expect: FC107
        if n in self.cfg.capture_sizes:
            torch.compiler.cudagraph_mark_step_begin()
            logits = self.compiled(self.input_ids, self.positions, md)
        else:
            logits = self.model(self.input_ids, self.positions, md)
        num_reqs = batch.common.num_reqs
        last = batch.common.query_start_loc[1:] - 1
        if getattr(self, "_logits_scratch", None) is None:
            self._logits_scratch = torch.empty(self.cfg.max_num_seqs, self.cfg.vocab_size, dtype=logits.dtype, device=self.device)  # ok: FC107
        torch.index_select(logits, 0, last, out=self._logits_scratch[:num_reqs])
        next_ids = torch.argmax(self._logits_scratch[:num_reqs], dim=-1)
        if self.sampled_host.numel() < num_reqs:
            self.sampled_host = torch.empty(2 * num_reqs, dtype=torch.int64, pin_memory=True)  # ok: FC107
        self.sampled_host[:num_reqs].copy_(next_ids, non_blocking=True)
        self.sampled_ready.record()
        if sched.decode_only_steps > 1 and md.num_prefill_tokens == 0:
            self.advance_decode_in_place(md, num_reqs)
        return self.sampled_ready

    def advance_decode_in_place(self, md: AttnStepMetadata, num_reqs: int) -> None:
        """The next step decodes the same requests inside their current pages: bump lengths, keep the plan."""
        md.seq_lens[:num_reqs].add_(1)
        last_page_len = self.builder.paged_kv_last_page_len[:num_reqs]
        torch.add(torch.remainder(md.seq_lens[:num_reqs] - 1, self.builder.page_size), 1, out=last_page_len)  # expect: FC104
        self.positions.add_(1)

    # ------------------------------------------------------------------ start-up
    def _dummy_common(self, n: int, kind: str) -> CommonAttentionMetadata:
        num_reqs = n if kind == "decode" else n // 2 + 1
        q_lens_cpu = torch.ones(num_reqs, dtype=torch.int32)
        q_lens_cpu[-1] = n - (num_reqs - 1)
        qsl_cpu = torch.zeros(num_reqs + 1, dtype=torch.int32)
        torch.cumsum(q_lens_cpu, dim=0, out=qsl_cpu[1:])
        seq_lens_cpu = q_lens_cpu + 1
        dev = self.device
        return CommonAttentionMetadata(
            num_reqs=num_reqs,
            num_actual_tokens=n,
            query_start_loc=qsl_cpu.to(dev),
            query_start_loc_cpu=qsl_cpu,
            seq_lens=seq_lens_cpu.to(dev),
            seq_lens_cpu=seq_lens_cpu,
            block_table=torch.zeros(num_reqs, self.cfg.max_blocks_per_seq, dtype=torch.int32, device=dev),
            slot_mapping=torch.arange(n, dtype=torch.int64, device=dev),
        )

    def capture_sizes(self) -> None:
        """Record reduce-overhead graphs for decode-only and mixed batches of every capture size."""
        torch.cuda.synchronize()  # ok: FC101
        for n in sorted(self.cfg.capture_sizes, reverse=True):
            for kind in ("decode", "mixed"):
                md = self.builder.build_for_capture(self._dummy_common(n, kind))
                max_seq = md.seq_lens.max().item()  # expect: FC101
                logger.info("recording %s graph: %d tokens, max_seq_len %d", kind, n, max_seq)
                # eager run first: JIT-compiles the FlashInfer kernels outside dynamo
                self.model(self.input_ids[:n], self.positions[:n], md)
                for _ in range(2):
                    torch.compiler.cudagraph_mark_step_begin()
                    self.compiled(self.input_ids[:n], self.positions[:n], md)
        torch.cuda.synchronize()

    def check_graph_wrappers(self) -> None:
        for n, w in self.builder.graph_decode_wrappers().items():
            if getattr(w, "_fixed_batch_size", n) != n:  # expect: FC103
                raise RuntimeError(f"graph decode wrapper for {n} rows was built for another batch size")
