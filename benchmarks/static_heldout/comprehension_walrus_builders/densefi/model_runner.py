"""vLLM-style GPU model runner: persistent inputs with pinned mirrors, metadata build, graph dispatch, sampling."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from itertools import chain
from typing import Optional

import numpy as np
import torch

from densefi.attention import FlashInferBackend, KVCacheSpec
from densefi.config import EngineConfig
from densefi.cuda_graph import CUDAGraphManager, StepBatch
from densefi.metadata import CommonAttentionMetadata, FlashInferMetadata, FlashInferMetadataBuilder
from densefi.model import PLACEHOLDER_TOKEN_ID, DenseModel, Sampler, SamplingMetadata
from densefi.workspace import WorkspacePool
from densefi_ops.introspect import buffer_report, wrapper_census
from densefi_ops.kv_pages import remap_block_ids

logger = logging.getLogger(__name__)


@dataclass
class NewRequest:
    req_id: str
    prompt_token_ids: list[int]
    block_ids: list[int]
    temperature: float = 1.0
    top_k: int = -1
    min_tokens: int = 0
    max_tokens: int = 256


@dataclass
class RequestState:
    req_id: str
    num_prompt: int
    num_computed: int = 0
    num_generated: int = 0
    temperature: float = 1.0
    top_k: int = -1
    min_tokens: int = 0
    max_tokens: int = 256


@dataclass
class SchedulerOutput:
    new_requests: list[NewRequest]
    num_scheduled_tokens: dict[str, int]
    new_block_ids: dict[str, list[int]]
    finished_req_ids: set[str]
    appended_token_ids: dict[str, list[int]] = field(default_factory=dict)
    draft_token_ids: dict[str, list[int]] = field(default_factory=dict)
    common_prefix_len: int = 0
    page_remap: Optional[torch.Tensor] = None


@dataclass
class ModelRunnerOutput:
    req_ids: list[str]
    sampled_token_ids: torch.Tensor  # pinned host rows, valid once `ready` has fired
    ready: torch.cuda.Event
    accepted: dict[str, torch.Tensor]
    eos_mask: torch.Tensor

    def token_lists(self) -> list[list[int]]:
        """Run by the output thread, after the step has returned."""
        self.ready.synchronize()
        return [[t for t in row if t != PLACEHOLDER_TOKEN_ID] for row in self.sampled_token_ids.tolist()]


class GPUModelRunner:
    _INPUT_SPECS = (("input_ids", torch.int64), ("positions", torch.int64), ("slot_mapping", torch.int64))

    def __init__(self, cfg: EngineConfig, device: torch.device) -> None:
        self.cfg = cfg
        self.device = device
        n_tok, n_req, width = cfg.max_num_batched_tokens, cfg.max_num_seqs, cfg.max_pages_per_seq
        groups = range(cfg.num_kv_cache_groups)
        self.input_buffers = {name: torch.zeros(n_tok, dtype=dt, device=device) for name, dt in self._INPUT_SPECS}
        self.input_mirrors = {name: torch.zeros(n_tok, dtype=dt, pin_memory=True) for name, dt in self._INPUT_SPECS}
        self.input_np = {name: t.numpy() for name, t in self.input_mirrors.items()}
        self.seq_lens_gpu, self.query_start_loc_gpu, self.num_draft_gpu = (
            torch.zeros(n, dtype=torch.int32, device=device) for n in (n_req, n_req + 1, n_req)
        )
        self.seq_lens_cpu, self.query_start_loc_cpu, self.num_draft_cpu = (
            torch.zeros(n, dtype=torch.int32, pin_memory=True) for n in (n_req, n_req + 1, n_req)
        )
        self.seq_lens_np, self.query_start_loc_np, self.num_draft_np = (
            t.numpy() for t in (self.seq_lens_cpu, self.query_start_loc_cpu, self.num_draft_cpu)
        )
        self.block_tables_gpu = [torch.zeros(n_req, width, dtype=torch.int32, device=device) for _ in groups]
        self.block_tables_cpu = [torch.zeros(n_req, width, dtype=torch.int32, pin_memory=True) for _ in groups]
        self.block_tables_np = [t.numpy() for t in self.block_tables_cpu]
        spec_w = max(1, cfg.num_spec_tokens)
        self.draft_tokens_gpu = torch.zeros(n_req, spec_w, dtype=torch.int64, device=device)
        self.draft_tokens_cpu = torch.zeros(n_req, spec_w, dtype=torch.int64, pin_memory=True)
        self.token_ids_cpu = torch.zeros(n_req, 2048, dtype=torch.int32)
        self.token_ids_np = self.token_ids_cpu.numpy()
        self.num_computed_np, self.num_blocks_np = (np.zeros(n_req, dtype=np.int32) for _ in range(2))
        self.sampled_cpu = torch.zeros(n_req, 1 + cfg.num_spec_tokens, dtype=torch.int64, pin_memory=True)
        self.sampled_ready = torch.cuda.Event()
        self.req_ids: list[str] = []
        self.requests: dict[str, RequestState] = {}
        self.stats: Counter[str] = Counter()

        self.pool = WorkspacePool(cfg, device)
        self.cache_spec = KVCacheSpec("NHD", cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.backend = FlashInferBackend(cfg, self.pool, device, self.cache_spec)
        self.builder = FlashInferMetadataBuilder(cfg, self.backend, device)
        self.model = DenseModel(cfg, self.backend).to(device=device, dtype=cfg.dtype)
        self.sampler = Sampler(cfg.vocab_size, cfg.eos_token_id)
        self.kv_caches = [
            torch.zeros(cfg.num_gpu_pages, *self.cache_spec.page_shape(), dtype=cfg.dtype, device=device)
            for _ in range(cfg.num_layers)
        ]
        self.graph_manager: Optional[CUDAGraphManager] = None

    # ------------------------------------------------------------------ start-up

    def initialize_graphs(self) -> None:
        sizes = tuple(bs for bs in self.cfg.cudagraph_batch_sizes if bs <= self.cfg.max_num_seqs)
        if not sizes:
            return
        self.backend.init_graph_wrappers(sizes)
        self.graph_manager = CUDAGraphManager(
            self.cfg,
            self.model,
            self.backend,
            self.kv_caches,
            sizes,
            self.device,
            block_table=self.block_tables_gpu[0],
        )
        self.graph_manager.record_all()

    def admin_stats(self) -> dict[str, int]:
        return {**buffer_report(self.backend), **wrapper_census(self.backend), **self.pool.describe(), **self.stats}

    # ------------------------------------------------------------------ request state

    def _row(self, req_id: str) -> int:
        return self.req_ids.index(req_id)

    def _update_states(self, sched: SchedulerOutput) -> None:
        if removed := {i for i, rid in enumerate(self.req_ids) if rid in sched.finished_req_ids}:
            keep = [i for i in range(len(self.req_ids)) if i not in removed]
            for rid in (self.req_ids[i] for i in sorted(removed)):
                self.requests.pop(rid, None)
            self.req_ids = [self.req_ids[i] for i in keep]
            self._condense(keep)
        for req in sched.new_requests:
            self._add_request(req)
        for rid, blocks in sched.new_block_ids.items():
            row, start = (r := self._row(rid)), self.num_blocks_np[r]
            for bt_np in self.block_tables_np:
                bt_np[row, start : start + len(blocks)] = blocks
            self.num_blocks_np[row] += len(blocks)
        for rid, toks in sched.appended_token_ids.items():
            st, row = self.requests[rid], self._row(rid)
            end = st.num_prompt + st.num_generated
            self.token_ids_np[row, end - len(toks) : end] = toks
        for rid, drafts in sched.draft_token_ids.items():
            row, st = self._row(rid), self.requests[rid]
            self.draft_tokens_cpu[row, : len(drafts)] = torch.tensor(drafts, dtype=torch.int64)
            first = st.num_prompt + st.num_generated
            self.token_ids_np[row, first : first + len(drafts)] = drafts
            self.num_draft_np[row] = len(drafts)

    def _condense(self, keep: list[int]) -> None:
        """Move the rows that stay to the front: the host tables with numpy, the device tables follow."""
        k = len(keep)
        host_tables = chain((self.num_computed_np, self.num_blocks_np, self.num_draft_np, self.token_ids_np), self.block_tables_np)
        for arr in host_tables:
            arr[:k] = arr[keep]
        keep_idx = torch.tensor(keep, dtype=torch.long, device=self.device)
        for gi, bt in enumerate(self.block_tables_gpu):
            self.block_tables_gpu[gi] = torch.cat([bt[keep_idx], bt.new_zeros(bt.shape[0] - k, bt.shape[1])])  # expect: FC107

    def _add_request(self, req: NewRequest) -> None:
        row = len(self.req_ids)
        self.req_ids.append(req.req_id)
        self.requests[req.req_id] = RequestState(
            req.req_id,
            len(req.prompt_token_ids),
            temperature=req.temperature,
            top_k=req.top_k,
            min_tokens=req.min_tokens,
            max_tokens=req.max_tokens,
        )
        if (need := len(req.prompt_token_ids) + req.max_tokens) > (width := self.token_ids_cpu.shape[1]):
            grow = torch.zeros(self.token_ids_cpu.shape[0], need - width, dtype=torch.int32)
            self.token_ids_cpu = torch.cat([self.token_ids_cpu, grow], dim=1)  # ok: FC107
            self.token_ids_np = self.token_ids_cpu.numpy()
        self.token_ids_np[row, : len(req.prompt_token_ids)] = req.prompt_token_ids
        self.num_computed_np[row] = 0
        self.num_blocks_np[row] = len(req.block_ids)
        for bt_np in self.block_tables_np:
            bt_np[row, : len(req.block_ids)] = req.block_ids

    # ------------------------------------------------------------------ inputs

    def _prepare_inputs(self, sched: SchedulerOutput) -> tuple[CommonAttentionMetadata, int, torch.Tensor]:
        n = len(self.req_ids)
        sched_np = np.fromiter((sched.num_scheduled_tokens[r] for r in self.req_ids), dtype=np.int32, count=n)
        num_tokens = int(sched_np.sum())
        self.query_start_loc_np[0] = 0
        np.cumsum(sched_np, out=self.query_start_loc_np[1 : n + 1])
        req_idx = np.repeat(np.arange(n), sched_np)
        pos_np = self.num_computed_np[req_idx] + np.arange(num_tokens) - np.repeat(self.query_start_loc_np[:n], sched_np)
        ps = self.cfg.page_size
        self.input_np["positions"][:num_tokens] = pos_np
        self.input_np["input_ids"][:num_tokens] = self.token_ids_np[req_idx, pos_np]
        pages = self.block_tables_np[0][req_idx, pos_np // ps]
        self.input_np["slot_mapping"][:num_tokens] = pages * ps + pos_np % ps
        self.seq_lens_np[:n] = self.num_computed_np[:n] + sched_np
        draft_rows = [i for i in range(n) if self.num_draft_np[i] > 0]  # ok: FC101

        hosts, devs = zip(*((self.input_mirrors[k], self.input_buffers[k]) for k, _ in self._INPUT_SPECS))
        for h, d in zip(hosts, devs):
            d[:num_tokens].copy_(h[:num_tokens], non_blocking=True)
        small = (
            (self.seq_lens_cpu, self.seq_lens_gpu, n),
            (self.query_start_loc_cpu, self.query_start_loc_gpu, n + 1),
            (self.num_draft_cpu, self.num_draft_gpu, n),
        )
        for h, d, m in small:
            d[:m].copy_(h[:m], non_blocking=True)
        for bt_cpu, bt_gpu in zip(self.block_tables_cpu, self.block_tables_gpu):
            bt_gpu[:n].copy_(bt_cpu[:n], non_blocking=True)
        if draft_rows:
            self.draft_tokens_gpu[:n].copy_(self.draft_tokens_cpu[:n], non_blocking=True)

        logits_np = np.arange(num_tokens) if draft_rows else self.query_start_loc_np[1 : n + 1] - 1
        logits_idx = torch.from_numpy(np.ascontiguousarray(logits_np, dtype=np.int64)).to(self.device, non_blocking=True)
        common = CommonAttentionMetadata(
            query_start_loc=self.query_start_loc_gpu[: n + 1],
            query_start_loc_cpu=self.query_start_loc_cpu[: n + 1],
            seq_lens=self.seq_lens_gpu[:n],
            seq_lens_cpu=self.seq_lens_cpu[:n],
            block_table=self.block_tables_gpu[0][:n],
            block_table_cpu=self.block_tables_cpu[0][:n],
            slot_mapping=self.input_buffers["slot_mapping"][:num_tokens],
            num_reqs=n,
            num_actual_tokens=num_tokens,
            num_draft_tokens=self.num_draft_gpu[:n] if draft_rows else None,
            num_draft_tokens_np=self.num_draft_np[:n] if draft_rows else None,
        )
        return common, num_tokens, logits_idx

    def _sampling_metadata(self, n: int, rows: int) -> SamplingMetadata:
        states = [self.requests[rid] for rid in self.req_ids[:n]]
        temps, top_ks, gens, mins = zip(*((s.temperature, s.top_k, s.num_generated, s.min_tokens) for s in states))
        names = ("temperature", "top_k", "num_generated", "min_tokens")
        host = dict(zip(names, map(np.asarray, (temps, top_ks, gens, mins))))
        dev = {k: torch.from_numpy(v).to(self.device, non_blocking=True) for k, v in host.items()}
        if rows != n:
            per_req = np.diff(self.query_start_loc_np[: n + 1])
            reps = torch.from_numpy(per_req).to(self.device, non_blocking=True)
            dev = {k: torch.repeat_interleave(v, reps, output_size=rows) for k, v in dev.items()}  # ok: FC101
            host = {k: np.repeat(v, per_req) for k, v in host.items()}
        return SamplingMetadata(
            temperature=dev["temperature"].float(),
            top_k=dev["top_k"],
            top_k_np=host["top_k"],
            num_generated=dev["num_generated"],
            min_tokens=dev["min_tokens"],
            all_greedy=all(t == 0.0 for t in temps),
            min_tokens_active=any(g < m for g, m in zip(gens, mins)),
        )

    # ------------------------------------------------------------------ the step

    @torch.inference_mode()
    def execute_model(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        self._update_states(sched)
        common, num_tokens, logits_idx = self._prepare_inputs(sched)
        meta = self.builder.build(common, common_prefix_len=sched.common_prefix_len)
        n = common.num_reqs
        ids, pos, slots = (self.input_buffers[k][:num_tokens] for k, _ in self._INPUT_SPECS)
        gm = self.graph_manager
        if gm is not None and not meta.num_prefills and (bs := gm.padded_size(n)) is not None:
            batch = StepBatch(n, num_tokens, meta, {"input_ids": ids, "positions": pos, "slot_mapping": slots})
            hidden = gm.execute(bs, batch)
        else:
            hidden = self.model(ids, pos, meta, self.kv_caches)
        logits = self.model.compute_logits(hidden[logits_idx])
        sampled = self.sampler(logits, self._sampling_metadata(n, logits.shape[0])).view(n, -1)
        if (k := sampled.shape[1] - 1) > 0:
            agree = (sampled[:, :k] == self.draft_tokens_gpu[:n, :k]).int().cumprod(dim=1)
            sampled[:, 1:] = torch.where(agree.bool(), sampled[:, 1:], PLACEHOLDER_TOKEN_ID)

        eos = sampled[:, 0] == self.cfg.eos_token_id
        if any(eos):  # expect: FC101
            self.stats["eos_steps"] += 1
        keep = sampled != PLACEHOLDER_TOKEN_ID
        step_out = {"token_ids": sampled, "row": meta.batch_arange[:, None].expand_as(sampled)}
        accepted = {name: t[keep] for name, t in step_out.items()}  # expect: FC101
        self.sampled_cpu[:n, : sampled.shape[1]].copy_(sampled, non_blocking=True)  # ok: FC101
        self.sampled_ready.record()

        if (remap := sched.page_remap) is not None:
            remap_block_ids(self.backend, remap.to(self.device, non_blocking=True))
        self._update_after_step(meta, keep, n)
        return ModelRunnerOutput(list(self.req_ids[:n]), self.sampled_cpu[:n], self.sampled_ready, accepted, eos)

    def _update_after_step(self, meta: FlashInferMetadata, keep: torch.Tensor, n: int) -> None:
        if not n:
            return
        req_ids, lens = zip(*zip(self.req_ids[:n], meta.seq_lens_cpu.tolist()))  # ok: FC101
        num_accepted = keep.sum(dim=1)
        for (rid, seq_len), acc in zip(zip(req_ids, lens), num_accepted.tolist()):  # expect: FC101
            st = self.requests[rid]
            st.num_computed = seq_len
            st.num_generated += acc
        self.num_computed_np[:n] = lens
        self.num_draft_np[:n] = 0


def build_runner(cfg: EngineConfig, device: Optional[torch.device] = None) -> GPUModelRunner:
    runner = GPUModelRunner(cfg, device or torch.device("cuda", torch.cuda.current_device()))
    runner.initialize_graphs()
    logger.info("workspaces: %s", runner.pool.describe())
    return runner


__all__ = ["GPUModelRunner", "SchedulerOutput", "NewRequest", "ModelRunnerOutput", "build_runner"]
