"""EAGLE-style speculative drafter: draft steps behind a middleware stack, draft graphs, a verify step."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import torch
from flashinfer.decode import trtllm_batch_decode_with_kv_cache
from flashinfer.prefill import trtllm_batch_context_with_kv_cache

from kwstack.config import DEFAULT_WORKSPACE_BYTES, DRAFT_WS_MB, ServerArgs
from kwstack.forward_batch import ForwardBatch
from kwstack.middleware import build_capture_stack, build_step_stack
from kwstack.model_runner import ModelRunner
from kwstack.plan_kwargs import bind_plan_arguments, make_decode_wrapper, prebind_plan, split_plan_run_kwargs
from kwstack_ops.workspace import alloc_workspace, decode_workspace_bytes, get_cached_workspace
from kwstack_ops.wrapper_compat import patch_wrapper


@dataclass
class SpecInfo:
    hidden_states: torch.Tensor
    topk_p: torch.Tensor
    topk_index: torch.Tensor


class EagleDrafter:
    VERIFY_WORKSPACE_BYTES = 128 << 20

    def __init__(self, sa: ServerArgs, draft_model, kv_cache: torch.Tensor):
        self.device = torch.device(sa.device)
        self.draft_model = draft_model
        self.kv_cache = kv_cache
        self.num_steps = sa.speculative_num_steps
        self.max_bs = sa.max_running_requests
        max_bs = self.max_bs
        self.plan_defaults = dict(
            num_qo_heads=sa.num_qo_heads,
            num_kv_heads=sa.num_kv_heads,
            head_dim=sa.head_dim,
            page_size=sa.page_size,
            q_data_type=torch.bfloat16,
        )
        self.max_draft_pages = sa.max_total_tokens

        ws_kwargs = dict(dtype=torch.uint8, device=self.device)
        self.draft_prefill_workspace = torch.zeros(DEFAULT_WORKSPACE_BYTES, **ws_kwargs)  # expect: FC106
        zeros_u8 = functools.partial(torch.zeros, dtype=torch.uint8, device=self.device)
        self.verify_workspace = zeros_u8(self.VERIFY_WORKSPACE_BYTES)  # expect: FC106
        self.trtllm_draft_workspace = torch.zeros(DRAFT_WS_MB << 20, **ws_kwargs)  # expect: FC106
        draft_bytes = decode_workspace_bytes(max_bs, sa.num_qo_heads, sa.head_dim)
        self.draft_decode_workspace = torch.empty(draft_bytes, **ws_kwargs)  # ok: FC105
        self.mtp_workspace = torch.empty(draft_bytes, **ws_kwargs)  # expect: FC105
        self.ctx_workspace = alloc_workspace(draft_bytes, self.device, zeroed=True)
        self.ctx_bytes = sa.chunked_prefill_size * sa.num_qo_heads * sa.head_dim * 4

        self.eager_kwargs = dict(use_tensor_cores=True, backend="fa2")
        self.draft_decode = make_decode_wrapper(self.draft_decode_workspace, "NHD", **self.eager_kwargs)
        self.verify_wrapper = make_decode_wrapper(self.verify_workspace, "NHD", **self.eager_kwargs)
        self._trtllm_decode = functools.partial(trtllm_batch_decode_with_kv_cache, workspace_buffer=self.mtp_workspace)
        self._trtllm_decode_big = functools.partial(
            trtllm_batch_decode_with_kv_cache, workspace_buffer=self.trtllm_draft_workspace
        )

        self.draft_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.draft_kv_indices = torch.zeros(sa.max_total_tokens, dtype=torch.int32, device=self.device)
        self.draft_last_page_len_gpu = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        self.verify_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.verify_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.step_offsets = torch.arange(1, max_bs + 1, dtype=torch.int32, device=self.device)
        self.accept_hist: List[int] = []

        self.step_stack = build_step_stack(self.draft_step, every=500, tag="draft")
        self.verify_stack = build_capture_stack(self.verify_step, tag="verify")
        self.graph_runner = DraftGraphRunner(self, sa)

    # ------------------------------------------------------------------ per step
    def propose(self, fb: ForwardBatch, accept_lens: torch.Tensor, spec: Optional[SpecInfo] = None, **kwargs):
        bs = fb.batch_size
        if spec is not None and bs in self.graph_runner.graphs:
            return self.graph_runner.replay_draft(fb, spec, bs)
        self._plan_draft_eager(fb, bs)
        outs = []
        for step in range(self.num_steps):
            outs.append(self.step_stack(fb, step, accept_lens=accept_lens if step == 0 else None, **kwargs))
        return outs

    def _plan_draft_eager(self, fb: ForwardBatch, bs: int) -> None:
        args = bind_plan_arguments(
            self.draft_kv_indptr[: bs + 1],
            self.draft_kv_indices,
            last_page_len=self.draft_last_page_len_gpu[:bs],
            **self.plan_defaults,
        )
        if args["indptr"][-1] > self.max_draft_pages:  # expect: FC101
            raise RuntimeError("draft KV pages exceed the pool")
        self.draft_decode.plan(**args)  # expect: FC102

    def _plan_verify(self, fb: ForwardBatch, bs: int, q: torch.Tensor, **kwargs) -> Dict[str, Any]:
        self.verify_indptr_cpu[1 : bs + 1] = torch.cumsum(fb.seq_lens_cpu, dim=0)
        bag = dict(
            indptr=self.verify_indptr_cpu[: bs + 1],
            indices=self.draft_kv_indices,
            last_page_len=self.verify_last_page_len_cpu[:bs],
            q=q,
            paged_kv_cache=self.kv_cache,
            **self.plan_defaults,
            **kwargs,
        )
        plan_kw, run_kw = split_plan_run_kwargs(bag)
        self.verify_wrapper.plan(**plan_kw)  # ok: FC102
        return run_kw

    def draft_step(self, fb: ForwardBatch, step: int, **kwargs) -> torch.Tensor:
        accept_lens = kwargs.pop("accept_lens", None)
        if accept_lens is not None:
            per_req = accept_lens.tolist()  # expect: FC101
            self.accept_hist.extend(per_req)
        bs = fb.batch_size
        q = self.draft_model.project(fb.input_ids, fb.positions)
        out = self.draft_decode.run(q, self.kv_cache)  # expect: FC108
        # one new draft token per request: advance the bound indptr for the next step
        bufs = self.graph_runner.bufs
        bufs["kv_indptr"][1 : bs + 1] += self.step_offsets[:bs]  # expect: FC104
        return out

    def verify_step(self, fb: ForwardBatch, *args, **kwargs) -> torch.Tensor:
        bs = fb.batch_size
        q = self.draft_model.project(fb.input_ids, fb.positions)
        w = self.graph_runner.graph_wrappers.get(bs) if fb.use_graph else self.verify_wrapper
        return w.run(q, self.kv_cache)  # ok: FC108

    def draft_extend(self, fb: ForwardBatch, q: torch.Tensor, block_tables, **kwargs) -> torch.Tensor:
        ws = get_cached_workspace("draft_ctx", self.ctx_bytes, self.device)
        return trtllm_batch_context_with_kv_cache(
            q, self.kv_cache, ws, block_tables, fb.seq_lens, **kwargs
        )

    def mtp_decode(self, q: torch.Tensor, block_tables, seq_lens, max_seq_len: int) -> torch.Tensor:
        return self._trtllm_decode(query=q, kv_cache=self.kv_cache, block_tables=block_tables,
                                   seq_lens=seq_lens, max_seq_len=max_seq_len)


class DraftGraphRunner:
    _STAGED = ("hidden_states", "topk_p", "topk_index")

    def __init__(self, drafter: EagleDrafter, sa: ServerArgs):
        self.drafter = drafter
        self.device = drafter.device
        self.capture_bs = sorted(b for b in sa.cuda_graph_bs if b <= drafter.max_bs)
        max_bs = self.capture_bs[-1]
        hidden = sa.num_qo_heads * sa.head_dim
        i32 = dict(dtype=torch.int32, device=self.device)
        self.bufs: Dict[str, torch.Tensor] = {
            "kv_indptr": torch.zeros(max_bs + 1, **i32),
            "kv_indices": torch.zeros(sa.max_total_tokens, **i32),
            "kv_last_page_len": torch.ones(max_bs, **i32),
        }
        self.bufs_cpu: Dict[str, torch.Tensor] = {
            "kv_indptr": torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True),
            "kv_last_page_len": torch.ones(max_bs, dtype=torch.int32, pin_memory=True),
        }
        self.static_inputs: Dict[str, torch.Tensor] = {
            "input_ids": torch.zeros(max_bs, dtype=torch.int64, device=self.device),
            "req_pool_indices": torch.zeros(max_bs, dtype=torch.int64, device=self.device),
            "seq_lens": torch.ones(max_bs, **i32),
            "seq_lens_cpu": torch.ones(max_bs, dtype=torch.int32),
            "out_cache_loc": torch.zeros(max_bs, dtype=torch.int64, device=self.device),
            "positions": torch.zeros(max_bs, dtype=torch.int64, device=self.device),
        }
        self.hidden_states = torch.zeros(max_bs, hidden, dtype=torch.bfloat16, device=self.device)
        self.topk_p = torch.zeros(max_bs, sa.speculative_eagle_topk, device=self.device)
        self.topk_index = torch.zeros(max_bs, sa.speculative_eagle_topk, dtype=torch.int64, device=self.device)
        self.accept_buf: Optional[torch.Tensor] = None
        ws_bytes = decode_workspace_bytes(max_bs, sa.num_qo_heads, sa.head_dim)
        self.graph_workspace = torch.zeros(ws_bytes, dtype=torch.uint8, device=self.device)  # ok: FC106
        self.graph_wrappers: Dict[int, Any] = {}
        self._plan_fns: Dict[int, Any] = {}
        self._plan_info: Dict[int, tuple] = {}
        self.graphs: Dict[int, tuple] = {}
        self.capture_stack = build_capture_stack(drafter.draft_step, tag="draft-capture")
        self.init_draft_wrappers()

    def _bound(self, bs: int) -> Dict[str, Any]:
        return dict(
            use_cuda_graph=True,
            paged_kv_indptr_buffer=self.bufs["kv_indptr"][: bs + 1],
            paged_kv_indices_buffer=self.bufs["kv_indices"],
            paged_kv_last_page_len_buffer=self.bufs["kv_last_page_len"][:bs],
        )

    def init_draft_wrappers(self) -> None:
        for bs in self.capture_bs:
            w = make_decode_wrapper(self.graph_workspace, "NHD", **self._bound(bs))
            self.graph_wrappers[bs] = w
            self._plan_fns[bs] = prebind_plan(w, **self.drafter.plan_defaults)
        self.bufs["kv_last_page_len"].fill_(1)
        # the eager verify wrapper is replanned every step: keep it out of graph mode
        patch_wrapper(self.drafter.verify_wrapper, _use_cuda_graph=False)

    def record_draft_graphs(self) -> None:
        for bs in reversed(self.capture_bs):
            fb = ForwardBatch.for_capture(bs, self.static_inputs)
            self._plan_fns[bs](
                self.bufs_cpu["kv_indptr"][: bs + 1], self.bufs["kv_indices"], self.bufs_cpu["kv_last_page_len"][:bs]
            )
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                out = self.capture_stack(fb, 0)
                verify_out = self.drafter.verify_stack(fb)
            self.graphs[bs] = (g, out, verify_out)
            self._plan_info[bs] = (bs, tuple(out.shape))  # ok: FC103

    def load_draft_inputs(self, fb: ForwardBatch, spec: SpecInfo, bs: int) -> None:
        raw_bs = fb.batch_size
        for name in self._STAGED:
            setattr(self, name, getattr(spec, name).clone())  # expect: FC107
        self.bufs_cpu["kv_indptr"][1 : raw_bs + 1] = torch.cumsum(fb.seq_lens_cpu, dim=0)
        self.bufs["kv_indptr"][: raw_bs + 1].copy_(self.bufs_cpu["kv_indptr"][: raw_bs + 1], non_blocking=True)
        self._plan_fns[bs](self.bufs["kv_indptr"][: bs + 1], self.bufs["kv_indices"], self.bufs["kv_last_page_len"][:bs])  # expect: FC102
        if self.accept_buf is None:
            self.accept_buf = torch.zeros(self.capture_bs[-1], dtype=torch.int32, device=self.device)

    def replay_draft(self, fb: ForwardBatch, spec: SpecInfo, bs: int):
        self.load_draft_inputs(fb, spec, bs)
        g, out, _ = self.graphs[bs]
        g.replay()
        return out[: fb.batch_size]


class EagleWorker:
    """Target verify + draft propose, once per scheduler step."""

    def __init__(self, sa: ServerArgs, target: ModelRunner, draft_model):
        self.target = target
        self.drafter = EagleDrafter(sa, draft_model, target.kv_cache)
        self.drafter.graph_runner.record_draft_graphs()

    def forward_batch_speculative(self, fb: ForwardBatch, draft_tokens: torch.Tensor, spec: SpecInfo):
        target_ids = self.target.forward_batch(fb)
        matches = (draft_tokens == target_ids.view(fb.batch_size, -1)).int()
        accept_lens = matches.cumprod(dim=-1).sum(dim=-1)
        return self.drafter.propose(fb, accept_lens, spec)
