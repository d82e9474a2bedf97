"""Model runner: a step is a fixed list of phases, each run by name (``_phase_<name>``), and each
phase picks its per-mode method by name in turn (``_prepare_<mode>``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from .attention import FlashInferBackend
from .config import EngineConfig
from .forward_batch import ForwardBatch, SamplingMetadata
from .graph_runner import CUDAGraphRunner
from .model import LlamaForCausalLM
from .sampler import Sampler, SamplerOutput

logger = logging.getLogger(__name__)


@dataclass
class ModelRunnerOutput:
    logits: torch.Tensor
    fb: ForwardBatch


@dataclass
class StepContext:
    sched_out: object
    mode: str
    fb: ForwardBatch | None = None
    hidden: torch.Tensor | None = None
    output: ModelRunnerOutput | None = None


@dataclass
class StepStats:
    num_tokens: int
    num_reqs: int
    num_eos: torch.Tensor  # device scalar: sampled EOS tokens this step


class ModelRunner:
    STEP_PHASES = ("prepare_inputs", "attn_metadata", "forward", "logits")

    def __init__(self, cfg: EngineConfig, device: torch.device) -> None:
        self.cfg = cfg
        self.device = device
        self.max_num_tokens = cfg.max_num_batched_tokens
        # persistent inputs: the captured graphs read these by address
        self.input_ids = torch.zeros(self.max_num_tokens, dtype=torch.int64, device=device)
        self.positions = torch.zeros(self.max_num_tokens, dtype=torch.int64, device=device)
        self.out_cache_loc = torch.zeros(self.max_num_tokens, dtype=torch.int64, device=device)
        self.block_table = torch.zeros(cfg.max_num_seqs, cfg.max_pages_per_seq, dtype=torch.int32, device=device)
        # pinned staging
        self.block_ids_cpu = torch.zeros(cfg.max_num_seqs * 64, dtype=torch.int32, pin_memory=True)
        self.block_table_cpu = torch.zeros(cfg.max_num_seqs, cfg.max_pages_per_seq, dtype=torch.int32, pin_memory=True)
        self.attn_backend = FlashInferBackend(cfg, device)
        self.sampler = Sampler(cfg, device)
        self.model: LlamaForCausalLM | None = None
        self.graph_runner: CUDAGraphRunner | None = None
        self.last_step_stats: StepStats | None = None

    def load_model(self) -> None:
        self.model = LlamaForCausalLM(self.cfg, self.attn_backend).to(device=self.device, dtype=torch.bfloat16)
        self.attn_backend.load_kv_scales(self.model.k_scale)

    def capture_model(self) -> None:
        self.graph_runner = CUDAGraphRunner(self)
        self.graph_runner.capture()

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        return self.model(input_ids, positions, fb)

    # ---- the step ------------------------------------------------------------------------------

    def step(self, sched_out) -> ModelRunnerOutput:
        mode = "decode" if sched_out.is_decode_only else "extend"
        if mode == "decode" and self.cfg.num_speculative_tokens:
            mode = "target_verify"
        ctx = StepContext(sched_out, mode)
        for phase in self.STEP_PHASES:
            getattr(self, f"_phase_{phase}")(ctx)
        return ctx.output

    def _phase_prepare_inputs(self, ctx: StepContext) -> None:
        prepare = getattr(self, f"_prepare_{ctx.mode}")  # ok: FC103
        fb = prepare(ctx.sched_out)
        if fb.batch_size > self.cfg.max_num_seqs:
            raise ValueError(f"batch of {fb.batch_size} exceeds max_num_seqs; seq_lens={fb.seq_lens}")  # ok: FC101
        ctx.fb = fb

    def _phase_attn_metadata(self, ctx: StepContext) -> None:
        fb = ctx.fb
        if self.graph_runner is not None and self.graph_runner.can_run(fb):
            fb.use_graph = True
            self.graph_runner.load_inputs(fb)
        else:
            self.attn_backend.init_forward_metadata(fb)

    def _phase_forward(self, ctx: StepContext) -> None:
        fb = ctx.fb
        if not fb.use_graph:
            ctx.hidden = self.forward(fb.input_ids, fb.positions, fb)
            return
        backend = self.attn_backend
        if fb.finished_mask is not None:
            # rows whose previous token was already EOS (async scheduling) replay as empty requests
            backend.kv_last_page_len[: fb.batch_size].masked_fill_(fb.finished_mask, 0)  # expect: FC104
        padded_tokens = fb.graph_bs * self.cfg.tokens_per_decode_req
        self.positions[fb.num_tokens : padded_tokens].zero_()  # ok: FC104
        ctx.hidden = self.graph_runner.replay(fb)

    def _phase_logits(self, ctx: StepContext) -> None:
        fb = ctx.fb
        if fb.mode == "extend":
            hidden = ctx.hidden[fb.query_start_loc[1 : fb.batch_size + 1] - 1]
        else:
            hidden = ctx.hidden[: fb.num_tokens]
        if fb.logits_mask is not None:
            hidden = hidden[fb.logits_mask]  # expect: FC101
        ctx.output = ModelRunnerOutput(self.model.compute_logits(hidden), fb)

    def sample(self, model_out: ModelRunnerOutput) -> SamplerOutput:
        fb = model_out.fb
        out = self.sampler(model_out.logits, fb.sampling)
        self.last_step_stats = StepStats(
            num_tokens=fb.num_tokens,
            num_reqs=fb.batch_size,
            num_eos=(out.sampled_token_ids == self.cfg.eos_token_id).sum(),
        )
        return out

    # ---- per-mode input preparation (run as _prepare_<mode>) -----------------------------------

    def _prepare_decode(self, sched_out) -> ForwardBatch:
        bs = sched_out.num_reqs
        pos_np = np.asarray(sched_out.num_computed_tokens, dtype=np.int64)
        ids_np = np.fromiter((t[-1] for t in sched_out.token_ids), dtype=np.int64, count=bs)
        self.input_ids[:bs].copy_(torch.from_numpy(ids_np), non_blocking=True)
        self.positions[:bs].copy_(torch.from_numpy(pos_np), non_blocking=True)
        finished = np.fromiter((t[-1] == self.cfg.eos_token_id for t in sched_out.token_ids), dtype=bool, count=bs)
        fb = self._finish_batch(
            "decode", sched_out, q_lens=np.ones(bs, dtype=np.int32), seq_lens_np=pos_np + 1,
            pos_np=pos_np, req_idx_np=np.arange(bs), temps=sched_out.temperatures,
        )
        if finished.any():
            fb.finished_mask = torch.from_numpy(finished).to(self.device, non_blocking=True)
        return fb

    def _prepare_target_verify(self, sched_out) -> ForwardBatch:
        bs = sched_out.num_reqs
        k1 = self.cfg.tokens_per_decode_req
        starts = np.asarray(sched_out.num_computed_tokens, dtype=np.int64)
        ids_np = np.array([[t[-1], *spec] for t, spec in zip(sched_out.token_ids, sched_out.spec_token_ids)],
                          dtype=np.int64).reshape(-1)
        pos_np = (starts[:, None] + np.arange(k1)[None, :]).reshape(-1)
        n = bs * k1
        self.input_ids[:n].copy_(torch.from_numpy(ids_np), non_blocking=True)
        self.positions[:n].copy_(torch.from_numpy(pos_np), non_blocking=True)
        return self._finish_batch(
            "target_verify", sched_out, q_lens=np.full(bs, k1, dtype=np.int32), seq_lens_np=starts + k1,
            pos_np=pos_np, req_idx_np=np.repeat(np.arange(bs), k1), temps=list(np.repeat(sched_out.temperatures, k1)),
        )

    def _prepare_extend(self, sched_out) -> ForwardBatch:
        bs = sched_out.num_reqs
        q_lens = np.array([sched_out.num_scheduled_tokens[r] for r in sched_out.req_ids], dtype=np.int32)
        starts = np.asarray(sched_out.num_computed_tokens, dtype=np.int64)
        ids_np = np.concatenate([np.asarray(t[s : s + q], dtype=np.int64)
                                 for t, s, q in zip(sched_out.token_ids, starts, q_lens)])
        pos_np = np.concatenate([np.arange(s, s + q) for s, q in zip(starts, q_lens)])
        n = len(ids_np)
        if n > self.input_ids.numel():
            # a step over the profiled budget (a long prompt re-fed after preemption): grow instead of failing
            extra = torch.zeros(n - self.input_ids.numel(), dtype=torch.int64, device=self.device)
            self.input_ids = torch.cat([self.input_ids, extra])  # expect: FC107
        self.input_ids[:n].copy_(torch.from_numpy(ids_np), non_blocking=True)
        self.positions[:n].copy_(torch.from_numpy(pos_np), non_blocking=True)
        seq_lens_np = starts + q_lens
        done = seq_lens_np >= np.array([len(t) for t in sched_out.token_ids])
        temps = [t for t, d in zip(sched_out.temperatures, done) if d]
        fb = self._finish_batch(
            "extend", sched_out, q_lens=q_lens, seq_lens_np=seq_lens_np, pos_np=pos_np,
            req_idx_np=np.repeat(np.arange(bs), q_lens), temps=temps,
        )
        fb.no_prefix = not starts.any()
        fb.extend_prefix_lens = torch.zeros(bs, dtype=torch.int32, device=self.device)  # ok: FC107
        fb.extend_prefix_lens.copy_(torch.from_numpy(starts.astype(np.int32)), non_blocking=True)
        if not done.all():
            fb.logits_mask = torch.from_numpy(done).to(self.device, non_blocking=True)
        return fb

    def _finish_batch(self, mode, sched_out, *, q_lens, seq_lens_np, pos_np, req_idx_np, temps) -> ForwardBatch:
        bs = len(q_lens)
        n = len(pos_np)
        page_ids, num_pages_np, last_page_len_np = self._stage_pages(sched_out, seq_lens_np, pos_np, req_idx_np)
        seq_lens_cpu = torch.from_numpy(seq_lens_np.astype(np.int32))
        qsl_cpu = torch.zeros(bs + 1, dtype=torch.int32)
        qsl_cpu[1:] = torch.from_numpy(np.cumsum(q_lens, dtype=np.int32))
        sampling = SamplingMetadata(
            temperatures=torch.tensor(temps, dtype=torch.float32).to(self.device, non_blocking=True),
            all_greedy=all(t == 0.0 for t in temps),
            all_random=all(t > 0.0 for t in temps),
        )
        return ForwardBatch(
            mode=mode,
            batch_size=bs,
            num_tokens=n,
            input_ids=self.input_ids[:n],
            positions=self.positions[:n],
            seq_lens=seq_lens_cpu.to(self.device, non_blocking=True),
            seq_lens_cpu=seq_lens_cpu,
            query_start_loc=qsl_cpu.to(self.device, non_blocking=True),
            query_start_loc_cpu=qsl_cpu,
            page_ids=page_ids,
            block_table=self.block_table[:bs],
            out_cache_loc=self.out_cache_loc[:n],
            num_pages_np=num_pages_np,
            last_page_len_np=last_page_len_np,
            sampling=sampling,
        )

    def _stage_pages(self, sched_out, seq_lens_np, pos_np, req_idx_np):
        page = self.cfg.page_size
        num_pages_np = ((seq_lens_np + page - 1) // page).astype(np.int32)
        last_page_len_np = ((seq_lens_np - 1) % page + 1).astype(np.int32)
        total = int(num_pages_np.sum())
        if total > self.block_ids_cpu.numel():
            self.block_ids_cpu = torch.zeros(2 * total, dtype=torch.int32, pin_memory=True)  # ok: FC107
        flat = self.block_ids_cpu.numpy()
        table = self.block_table_cpu.numpy()
        off = 0
        for i, (pages, cnt) in enumerate(zip(sched_out.block_tables, num_pages_np)):
            flat[off : off + cnt] = pages[:cnt]
            table[i, :cnt] = pages[:cnt]
            off += cnt
        bs = len(num_pages_np)
        slots_np = table[req_idx_np, pos_np // page].astype(np.int64) * page + pos_np % page
        self.out_cache_loc[: len(slots_np)].copy_(torch.from_numpy(slots_np), non_blocking=True)
        self.block_table[:bs].copy_(self.block_table_cpu[:bs], non_blocking=True)
        return self.block_ids_cpu[:total].to(self.device, non_blocking=True), num_pages_np, last_page_len_np
