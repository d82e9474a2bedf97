"""EAGLE-style drafter: a one-layer draft head over the target's hidden states.

Draft steps run eagerly or from per-bucket CUDA graphs recorded by DraftGraphRunner. After
verification a draft-extend step re-encodes the verified tokens to refresh the head's KV
and hidden state (also recorded as a graph per bucket).
"""
from __future__ import annotations

import bisect
import functools
import logging
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    CUDAGraphBatchDecodeWithPagedKVCacheWrapper,
)
from torch import nn

from lrc_kernels.pages import fill_kv_indices, page_math

from .attention import FlashInferDecodeBackend
from .config import EngineConfig
from .decorators import phase_timer
from .forward_batch import ForwardBatch, ForwardMode, StepOutput
from .graph_runner import StaticInputs
from .resources import bucket_buffers, pinned_bucket, workspace_for_limits

logger = logging.getLogger(__name__)


@dataclass
class DraftOutput:
    tokens: torch.Tensor  # [bs, k] target-vocabulary ids, device
    bs: int


@dataclass
class VerifyResult:
    accept_lens: torch.Tensor   # [bs] device
    next_ids: torch.Tensor      # [bs, k] device: draft where accepted, target's correction elsewhere
    bonus_tokens: torch.Tensor  # [bs] device
    accept_indptr: torch.Tensor


class DraftHead(nn.Module):
    def __init__(self, cfg: EngineConfig, attend: Callable) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.hq, self.hkv, self.d = cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim
        self.embed = nn.Embedding(cfg.vocab_size, h)
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.qkv_proj = nn.Linear(h, (self.hq + 2 * self.hkv) * self.d, bias=False)
        self.o_proj = nn.Linear(self.hq * self.d, h, bias=False)
        self.norm = nn.RMSNorm(h)
        self.lm_head = nn.Linear(h, cfg.draft_vocab_size, bias=False)
        self.attend = attend

    def forward(self, fb: ForwardBatch, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.fc(torch.cat([self.embed(fb.input_ids), hidden], dim=-1))
        q, k, v = self.qkv_proj(x).split([self.hq * self.d, self.hkv * self.d, self.hkv * self.d], dim=-1)
        o = self.attend(q.view(-1, self.hq, self.d), k.view(-1, self.hkv, self.d), v.view(-1, self.hkv, self.d), fb)
        h = x + self.o_proj(o.reshape(x.shape[0], -1))
        return self.lm_head(self.norm(h)), h


class Drafter:
    # eager draft decode runs on trtllm-gen (HND pages); graph buckets use FA2 graph wrappers
    decode_backend = "trtllm-gen"
    # one workspace shared by every draft graph bucket
    DRAFT_GRAPH_WS_BYTES = 64 * 1024 * 1024

    def __init__(self, cfg: EngineConfig, backend: FlashInferDecodeBackend, device: torch.device) -> None:
        self.cfg = cfg
        self.backend = backend
        self.device = device
        self.k = cfg.num_draft_tokens
        max_bs = cfg.max_batch_size
        shape = (cfg.num_pages, cfg.num_kv_heads, cfg.page_size, cfg.head_dim)
        self.draft_kv = (
            torch.zeros(shape, dtype=cfg.dtype, device=device),
            torch.zeros(shape, dtype=cfg.dtype, device=device),
        )
        # read by the recorded draft graphs
        self.hidden_states = torch.zeros(max_bs, cfg.hidden_size, dtype=cfg.dtype, device=device)
        self.d_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.d_kv_indices = torch.zeros(cfg.num_pages, dtype=torch.int32, device=device)
        self.d_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        # eager draft steps
        self.step_kv_indptr_gpu = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.step_kv_indices = torch.zeros(cfg.num_pages, dtype=torch.int32, device=device)
        self.step_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.extend_qo_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self._accept_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self._token_hits = torch.zeros(cfg.vocab_size, dtype=torch.int64, device=device)
        self._draft_tokens = None
        self.graph_ws = torch.zeros(self.DRAFT_GRAPH_WS_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.draft_wrapper = BatchDecodeWithPagedKVCacheWrapper(
            self.draft_workspace, "HND", use_cuda_graph=False, backend=self.decode_backend
        )
        self.extend_wrapper = BatchPrefillWithPagedKVCacheWrapper(
            workspace_for_limits(device, cfg.max_num_tokens, cfg.num_qo_heads, cfg.head_dim), "HND", backend="fa2"
        )
        self.token_map: dict[int, int] = {}
        self.model = DraftHead(cfg, self.draft_attention).to(device=device, dtype=cfg.dtype)
        self.graph_runner = DraftGraphRunner(self)

    # ---------------------------------------------------------------- cached resources

    @functools.cached_property
    def draft_workspace(self) -> torch.Tensor:
        """trtllm-gen scratch of the eager draft wrapper (its split-k semaphores live here)."""
        return torch.empty(self.cfg.trtllm_workspace_bytes(), dtype=torch.uint8, device=self.device)  # expect: FC105

    @functools.cached_property
    def graph_wrappers(self) -> dict[int, CUDAGraphBatchDecodeWithPagedKVCacheWrapper]:
        return {
            bs: CUDAGraphBatchDecodeWithPagedKVCacheWrapper(
                self.graph_ws, self.d_kv_indptr[: bs + 1], self.d_kv_indices, self.d_last_page_len[:bs], "HND"
            )
            for bs in self.graph_runner.sizes
        }

    @functools.cached_property
    def _plan_step(self) -> Callable:
        """draft_wrapper.plan with the model's constants bound."""
        cfg = self.cfg
        return functools.partial(
            self.draft_wrapper.plan,
            num_qo_heads=cfg.num_qo_heads,
            num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            page_size=cfg.page_size,
            q_data_type=cfg.dtype,
            kv_data_type=cfg.dtype,
        )

    def load_token_map(self, d2t: np.ndarray) -> None:
        """Draft-vocabulary id -> target id (EAGLE-3's d2t offsets)."""
        self.token_map = {i: i + int(off) for i, off in enumerate(d2t)}

    def reload(self, state_dict: dict) -> None:
        """Hot-swap the draft head; the eager wrapper is rebuilt with it."""
        self.model.load_state_dict(state_dict, strict=False)
        self.draft_wrapper = BatchDecodeWithPagedKVCacheWrapper(
            self.draft_workspace, "HND", use_cuda_graph=False, backend=self.decode_backend
        )
        # the cached partial still binds the old wrapper's plan
        self.__dict__.pop("_plan_step", None)  # ok: FC103

    # ---------------------------------------------------------------- attention

    def _write_draft_kv(self, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        page, off = loc // self.cfg.page_size, loc % self.cfg.page_size
        kc, vc = self.draft_kv
        kc[page, :, off] = k
        vc[page, :, off] = v

    def draft_attention(self, q, k, v, fb: ForwardBatch) -> torch.Tensor:
        self._write_draft_kv(fb.out_cache_loc, k, v)
        if fb.forward_mode.is_draft_extend():
            return self.extend_wrapper.run(q, self.draft_kv)  # expect: FC108
        if fb.use_graph:
            return self.graph_wrappers[fb.batch_size].run(q, self.draft_kv)  # ok: FC108
        return self.draft_wrapper.run(q, self.draft_kv)  # ok: FC108

    # ---------------------------------------------------------------- plans

    def plan_draft_graph(self, bs: int, indptr_host: torch.Tensor, last_page_len_host: torch.Tensor) -> None:
        self.graph_wrappers[bs].plan(  # ok: FC102
            indptr_host,
            self.d_kv_indices,
            last_page_len_host,
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            q_data_type=self.cfg.dtype,
        )

    def _plan_draft_step(self, fb: ForwardBatch) -> None:
        bs = fb.batch_size
        pages_np, last_np = page_math(fb.seq_lens_cpu.numpy(), self.cfg.page_size)
        indptr_np = np.zeros(bs + 1, dtype=np.int32)
        np.cumsum(pages_np, out=indptr_np[1:])
        self.step_kv_indptr_gpu[: bs + 1].copy_(torch.from_numpy(indptr_np), non_blocking=True)
        self.step_last_page_len_cpu[:bs].copy_(torch.from_numpy(last_np))
        fill_kv_indices(
            self.backend.req_to_page, fb.req_pool_indices, self.step_kv_indptr_gpu[: bs + 1],
            self.step_kv_indices, int(indptr_np[-1]),
        )
        self._plan_step(  # expect: FC102
            self.step_kv_indptr_gpu[: bs + 1],
            self.step_kv_indices,
            self.step_last_page_len_cpu[:bs],
        )

    def _plan_draft_extend(self, fb: ForwardBatch) -> None:
        bs = fb.batch_size
        ps = self.cfg.page_size
        dev = bucket_buffers(bs, self.cfg.num_pages, self.device)
        tpr = fb.tokens_per_req
        self.extend_qo_indptr_cpu[: bs + 1].copy_(torch.arange(0, (bs + 1) * tpr, tpr, dtype=torch.int32))
        # page math on the device, no host loop over the rows
        pages = (fb.seq_lens + ps - 1) // ps
        torch.cumsum(pages, 0, dtype=torch.int32, out=dev.kv_indptr[1:])
        dev.last_page_len.copy_(fb.seq_lens - (pages - 1) * ps)
        total = int(((fb.seq_lens_cpu + ps - 1) // ps).sum())
        fill_kv_indices(self.backend.req_to_page, fb.req_pool_indices, dev.kv_indptr, dev.kv_indices, total)
        self.extend_wrapper.plan(  # expect: FC102
            self.extend_qo_indptr_cpu[: bs + 1],
            dev.kv_indptr,
            dev.kv_indices,
            dev.last_page_len,
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            causal=True,
            q_data_type=self.cfg.dtype,
        )

    # ---------------------------------------------------------------- per step

    def _draft_decode_batch(self, batch: ForwardBatch, step: int, input_ids: torch.Tensor) -> ForwardBatch:
        return ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=batch.batch_size,
            input_ids=input_ids,
            positions=batch.positions + step,
            seq_lens=batch.seq_lens + step,
            seq_lens_cpu=batch.seq_lens_cpu + step,
            req_pool_indices=batch.req_pool_indices,
            out_cache_loc=batch.out_cache_loc + step,
            temperatures=batch.temperatures,
            top_p=batch.top_p,
        )

    def propose(self, batch: ForwardBatch) -> DraftOutput:
        bs = batch.batch_size
        if self._draft_tokens is None:
            self._draft_tokens = torch.zeros(self.cfg.max_batch_size, self.k, dtype=torch.int64, device=self.device)  # ok: FC107
        draft = self._draft_tokens[:bs]
        if self.graph_runner.can_run(bs):
            logits = self.graph_runner.replay_draft(self.graph_runner.bucket(bs), batch)
            torch.argmax(logits[:bs], dim=-1, out=draft)
        else:
            ids = batch.input_ids
            for step in range(self.k):
                fb = self._draft_decode_batch(batch, step, ids)
                self._plan_draft_step(fb)
                step_logits, h = self.model(fb, self.hidden_states[:bs])
                self.hidden_states[:bs].copy_(h)
                ids = torch.argmax(step_logits, dim=-1)
                draft[:, step] = ids
        # the head predicts in its reduced vocabulary: map back to target ids
        rows = draft.tolist()  # expect: FC101
        mapped = [[self.token_map.get(t, t) for t in row] for row in rows]
        tokens = torch.tensor(mapped, dtype=torch.int64).to(self.device, non_blocking=True)
        return DraftOutput(tokens=tokens, bs=bs)

    def make_verify_batch(self, batch: ForwardBatch, draft: DraftOutput) -> ForwardBatch:
        bs, t = batch.batch_size, self.k + 1
        offs = torch.arange(t, dtype=torch.int64, device=self.device)
        return ForwardBatch(
            forward_mode=ForwardMode.TARGET_VERIFY,
            batch_size=bs,
            input_ids=torch.cat([batch.input_ids[:, None], draft.tokens], dim=1).reshape(-1),
            positions=(batch.positions[:, None] + offs).reshape(-1),
            seq_lens=batch.seq_lens + self.k,
            seq_lens_cpu=batch.seq_lens_cpu + self.k,
            req_pool_indices=batch.req_pool_indices,
            # the scheduler reserves num_draft_tokens + 1 consecutive slots per row
            out_cache_loc=(batch.out_cache_loc[:, None] + offs).reshape(-1),
            temperatures=batch.temperatures,
            top_p=batch.top_p,
            tokens_per_req=t,
        )

    def verify(self, vbatch: ForwardBatch, draft: DraftOutput, out: StepOutput) -> VerifyResult:
        bs, t = vbatch.batch_size, self.k + 1
        target = out.next_tokens.view(bs, t)
        match = draft.tokens == target[:, : self.k]
        prefix = match.to(torch.int32).cumprod(dim=1) > 0
        accept_lens = prefix.sum(dim=1, dtype=torch.int32)
        # accepted draft tokens, flattened, for the per-token acceptance statistics
        accepted = draft.tokens[prefix]  # expect: FC101
        self._token_hits.index_add_(0, accepted, torch.ones_like(accepted))
        next_ids = torch.where(prefix, draft.tokens, target[:, : self.k])  # ok: FC101
        bonus = target.gather(1, accept_lens[:, None].long()).squeeze(1)
        if getattr(self, "_accept_len_buf", None) is None:
            self._accept_len_buf = torch.zeros(self.cfg.max_batch_size, dtype=torch.int32, device=self.device)  # ok: FC107
        self._accept_len_buf[:bs].copy_(accept_lens)
        torch.cumsum(accept_lens + 1, 0, dtype=torch.int32, out=self._accept_indptr[1 : bs + 1])  # ok: FC104
        # hidden state of each row's last verified token seeds the next draft round
        last = torch.arange(bs, device=self.device) * t + accept_lens
        self.hidden_states = out.hidden[last].clone()  # expect: FC107
        return VerifyResult(
            accept_lens=accept_lens, next_ids=next_ids, bonus_tokens=bonus,
            accept_indptr=self._accept_indptr[: bs + 1],
        )

    def extend_after_verify(self, vbatch: ForwardBatch, out: StepOutput) -> None:
        """Draft extend: run the head over the verified tokens to refresh its KV and hidden state."""
        bs = vbatch.batch_size
        fb = ForwardBatch(
            forward_mode=ForwardMode.DRAFT_EXTEND,
            batch_size=bs,
            input_ids=vbatch.input_ids,
            positions=vbatch.positions,
            seq_lens=vbatch.seq_lens,
            seq_lens_cpu=vbatch.seq_lens_cpu,
            req_pool_indices=vbatch.req_pool_indices,
            out_cache_loc=vbatch.out_cache_loc,
            temperatures=vbatch.temperatures,
            top_p=vbatch.top_p,
            tokens_per_req=vbatch.tokens_per_req,
        )
        if self.graph_runner.can_run_extend(bs):
            self.graph_runner.replay_extend(self.graph_runner.bucket(bs), fb, out.hidden)
            return
        self._plan_draft_extend(fb)
        self.model(fb, out.hidden)


class DraftGraphRunner:
    """Records one draft-decode graph and one draft-extend graph per bucket."""

    def __init__(self, drafter: Drafter) -> None:
        self.drafter = drafter
        cfg = drafter.cfg
        self.cfg = cfg
        self.device = drafter.device
        self.sizes = [bs for bs in sorted(cfg.capture_sizes) if bs <= 64]
        self.max_bs = self.sizes[-1]
        n, dev = self.max_bs * (cfg.num_draft_tokens + 1), drafter.device
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(n, dtype=torch.int64, device=dev)
        self.out_cache_loc = torch.zeros(n, dtype=torch.int64, device=dev)
        self.hidden_in = torch.zeros(n, cfg.hidden_size, dtype=cfg.dtype, device=dev)
        self.seq_lens = torch.ones(self.max_bs, dtype=torch.int32, device=dev)
        self.seq_lens_cpu = torch.ones(self.max_bs, dtype=torch.int32, pin_memory=True)
        self.req_pool_indices = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.temperatures = torch.ones(self.max_bs, dtype=torch.float32, device=dev)
        self.top_p = torch.ones(self.max_bs, dtype=torch.float32, device=dev)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.extend_graphs: dict[int, torch.cuda.CUDAGraph] = {}

    def _static(self) -> StaticInputs:
        return StaticInputs(
            input_ids=self.input_ids,
            positions=self.positions,
            seq_lens=self.seq_lens,
            seq_lens_cpu=self.seq_lens_cpu,
            req_pool_indices=self.req_pool_indices,
            out_cache_loc=self.out_cache_loc,
            temperatures=self.temperatures,
            top_p=self.top_p,
        )

    def bucket(self, bs: int) -> int:
        return self.sizes[bisect.bisect_left(self.sizes, bs)]

    def can_run(self, bs: int) -> bool:
        return bs <= self.max_bs and bool(self.graphs)

    def can_run_extend(self, bs: int) -> bool:
        return bs <= self.max_bs and bool(self.extend_graphs)

    @phase_timer("draft graph capture")
    def record_draft_graphs(self) -> None:
        d = self.drafter
        tpr = self.cfg.num_draft_tokens + 1
        for bs in reversed(self.sizes):
            fb = ForwardBatch.for_capture(ForwardMode.DECODE, bs, 1, self._static())
            d.plan_draft_graph(bs, torch.arange(bs + 1, dtype=torch.int32), torch.ones(bs, dtype=torch.int32))
            d.model(fb, d.hidden_states[:bs])  # warm-up
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                logits, h = d.model(fb, d.hidden_states[:bs])
                d.hidden_states[:bs].copy_(h)
            self.graphs[bs] = graph
            self.outputs[bs] = logits

            fbx = ForwardBatch.for_capture(ForwardMode.DRAFT_EXTEND, bs, tpr, self._static())
            d._plan_draft_extend(fbx)
            xgraph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(xgraph):
                d.model(fbx, self.hidden_in[: bs * tpr])
            self.extend_graphs[bs] = xgraph

    def load_draft_inputs(self, bs: int, batch: ForwardBatch) -> None:
        d = self.drafter
        raw = batch.batch_size
        self.input_ids[:raw].copy_(batch.input_ids, non_blocking=True)
        self.positions[:raw].copy_(batch.positions, non_blocking=True)
        self.out_cache_loc[:raw].copy_(batch.out_cache_loc, non_blocking=True)
        self.req_pool_indices[:raw].copy_(batch.req_pool_indices, non_blocking=True)
        host = pinned_bucket(bs, self.cfg.num_pages, "draft")
        pages_np, last_np = page_math(batch.seq_lens_cpu.numpy(), self.cfg.page_size)
        host.kv_indptr[0] = 0
        np.cumsum(pages_np, out=host.kv_indptr[1 : raw + 1].numpy())
        host.kv_indptr[raw + 1 :] = host.kv_indptr[raw]
        host.last_page_len[:raw].copy_(torch.from_numpy(last_np))
        host.last_page_len[raw:] = 1
        total = int(host.kv_indptr[raw])
        d.d_kv_indptr[: bs + 1].copy_(host.kv_indptr, non_blocking=True)
        fill_kv_indices(d.backend.req_to_page, batch.req_pool_indices, d.d_kv_indptr[: raw + 1], d.d_kv_indices, total)
        d.plan_draft_graph(bs, host.kv_indptr, host.last_page_len)

    def replay_draft(self, bs: int, batch: ForwardBatch) -> torch.Tensor:
        d = self.drafter
        self.load_draft_inputs(bs, batch)
        steps = []
        for _ in range(d.k):
            self.graphs[bs].replay()
            logits = self.outputs[bs]
            steps.append(logits.clone())
            self.input_ids[:bs].copy_(torch.argmax(logits, dim=-1))
            self.positions[:bs].add_(1)
            self.out_cache_loc[:bs].add_(1)
            # one more token per row: advance the bound lengths instead of planning again
            d.d_last_page_len[:bs].add_(1)  # expect: FC104
        return torch.stack(steps, dim=1)

    def replay_extend(self, bs: int, fb: ForwardBatch, hidden: torch.Tensor) -> None:
        raw, tpr = fb.batch_size, fb.tokens_per_req
        n = raw * tpr
        self.input_ids[:n].copy_(fb.input_ids, non_blocking=True)
        self.positions[:n].copy_(fb.positions, non_blocking=True)
        self.out_cache_loc[:n].copy_(fb.out_cache_loc, non_blocking=True)
        self.hidden_in[:n].copy_(hidden[:n])
        self.seq_lens[:raw].copy_(fb.seq_lens, non_blocking=True)
        self.seq_lens_cpu[:raw].copy_(fb.seq_lens_cpu)
        self.req_pool_indices[:raw].copy_(fb.req_pool_indices, non_blocking=True)
        static_fb = ForwardBatch.for_capture(ForwardMode.DRAFT_EXTEND, bs, tpr, self._static())
        self.drafter._plan_draft_extend(static_fb)
        self.extend_graphs[bs].replay()
