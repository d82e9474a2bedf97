"""FlashInfer attention backend whose per-step work is picked from tables keyed by the forward mode.

* eager metadata: ``init_forward_metadata`` dispatches by method name to ``_plan_<mode>``;
* each mode's wrappers are planned by the ``PlanRecipe`` members listed for it (members carry partial planners);
* forward: ``self._forward_table[(mode, use_graph)]`` holds the bound handler;
* replay: ``prepare_graph_step`` refreshes the graph-bound buffers and calls ``self._replay_planners[...]``;
* after a step the model runner calls ``post_step_hooks[mode]``.
"""

from __future__ import annotations

import logging
import operator
from typing import TYPE_CHECKING, Callable, Dict, Optional, Tuple

import numpy as np
import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
)
from flashinfer.decode import trtllm_batch_decode_with_kv_cache
from flashinfer.prefill import trtllm_batch_context_with_kv_cache

from kvops.pages import gather_kv_indices
from tabserve.attention.planners import (
    RECIPES_BY_MODE,
    HeadSpec,
    PlanBuffers,
    PlanRecipe,
    PlanSlot,
    plan_paged_decode,
    slot_plan,
)
from tabserve.batch import ForwardBatch
from tabserve.config import EngineConfig, ModelConfig
from tabserve.modes import Feature, ForwardMode, WorkspaceSize
from tabserve.workspace import WorkspaceKind, allocate_workspace, extend_workspace, zeroed_scratch

if TYPE_CHECKING:
    from tabserve.model import RadixAttention

logger = logging.getLogger(__name__)

HandlerKey = Tuple[ForwardMode, bool]
Handler = Callable[..., torch.Tensor]


def _no_hook(fb: ForwardBatch) -> None:
    return None


class FlashInferTableBackend:
    def __init__(
        self, cfg: EngineConfig, model_cfg: ModelConfig, req_to_page: torch.Tensor, device: torch.device
    ) -> None:
        self.cfg = cfg
        self.device = device
        self.features = cfg.features
        self.req_to_page = req_to_page
        self.heads = HeadSpec(
            model_cfg.num_qo_heads, model_cfg.num_kv_heads, model_cfg.head_dim, cfg.page_size, model_cfg.dtype
        )
        self.sliding_window = model_cfg.sliding_window
        self.soft_cap: Optional[float] = (
            model_cfg.logit_softcap if Feature.LOGITS_SOFTCAP in self.features else None
        )
        self._kv_layout = "NHD"
        # (mode, batch size, wrapper plan) of the last eager decode plan, for /debug/plan.
        self._plan_info: Optional[Tuple[ForwardMode, int, object]] = None
        self._decode_max_seq_len = cfg.max_context_len
        self._extend_max_q = 0
        self.use_ragged = False

        self.bufs = PlanBuffers.allocate(cfg.max_batch_size, cfg.max_total_pages, device)
        self.page_counts_cpu = torch.zeros(cfg.max_batch_size, dtype=torch.int32, pin_memory=True)
        self.custom_mask_buf: Optional[torch.Tensor] = None

        self.workspace = allocate_workspace(WorkspaceKind.FLOAT, cfg.workspace_bytes, device)
        self.ragged_workspace = extend_workspace(ForwardMode.EXTEND, device)
        self.verify_workspace = torch.zeros(WorkspaceSize.VERIFY, dtype=torch.uint8, device=device)  # expect: FC106
        swa_backend = "trtllm-gen" if Feature.TRTLLM_DECODE in self.features else "fa2"
        self.swa_workspace = torch.empty(cfg.workspace_bytes // 4, dtype=torch.uint8, device=device)  # expect: FC105
        if Feature.TRTLLM_DECODE in self.features:
            self.trtllm_workspace = allocate_workspace(WorkspaceKind.TRTLLM, cfg.trtllm_workspace_bytes, device)
            self.trtllm_ctx_workspace = zeroed_scratch(cfg.trtllm_workspace_bytes, device)

        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.workspace, self._kv_layout, backend="fa2")
        self.swa_decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(
            self.swa_workspace, self._kv_layout, backend=swa_backend
        )
        self.prefill_wrapper_ragged = BatchPrefillWithRaggedKVCacheWrapper(self.ragged_workspace, self._kv_layout)
        self.prefill_wrapper_paged = BatchPrefillWithPagedKVCacheWrapper(self.workspace, self._kv_layout)
        self.verify_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.verify_workspace, self._kv_layout)
        self.graph_slots: Dict[int, PlanSlot] = {}
        self.graph_workspace: Optional[torch.Tensor] = None

        self._forward_table: Dict[HandlerKey, Handler] = {
            (ForwardMode.DECODE, False): self._forward_decode_eager,
            (ForwardMode.DECODE, True): self._forward_decode_graph,
            (ForwardMode.EXTEND, False): self._forward_extend,
            (ForwardMode.MIXED, False): self._forward_extend,
            (ForwardMode.TARGET_VERIFY, False): self._forward_verify,
            (ForwardMode.TARGET_VERIFY, True): self._forward_verify,
        }
        self._replay_planners: Dict[HandlerKey, Callable[[ForwardBatch], None]] = {
            (ForwardMode.DECODE, True): self._replay_plan_decode,
            (ForwardMode.TARGET_VERIFY, True): self._replay_plan_verify,
        }
        self.post_step_hooks: Dict[ForwardMode, Callable[[ForwardBatch], None]] = {
            ForwardMode.DECODE: self._advance_decode_lengths,
            ForwardMode.EXTEND: _no_hook,
            ForwardMode.MIXED: _no_hook,
            ForwardMode.TARGET_VERIFY: _no_hook,
        }

    # ------------------------------------------------------------------ registration / set-up

    def register_forward_handler(self, mode: ForwardMode, use_graph: bool, handler: Handler) -> None:
        """Plug in an extra (mode, graph) entry, e.g. an encoder-only mode of a multimodal model."""
        assert (mode, use_graph) not in self._forward_table, f"{mode.name}/{use_graph} already handled"  # expect: FC109
        self._forward_table[(mode, use_graph)] = handler

    def init_cuda_graph_state(self, max_bs: int) -> None:
        self.graph_max_bs = max_bs
        self.graph_workspace = torch.zeros(self.cfg.workspace_bytes, dtype=torch.uint8, device=self.device)  # ok: FC106
        self.graph_slots.clear()

    def warmup_jit(self) -> None:
        """Report wrappers whose JIT module is not built yet (the first step would compile it)."""
        for name in ("decode_wrapper", "prefill_wrapper_paged", "verify_wrapper"):
            wrapper = getattr(self, name)
            if wrapper._cached_module is None:  # expect: FC103
                logger.warning("%s: JIT module not built, the first step compiles it", name)

    # ------------------------------------------------------------------ host mirrors

    def _fill_host_mirrors(self, bs: int, seq_lens_cpu: torch.Tensor) -> int:
        page = self.cfg.page_size
        lens = seq_lens_cpu[:bs].numpy()
        pages = (lens + page - 1) // page
        if self.page_counts_cpu.numel() < bs:
            self.page_counts_cpu = torch.zeros(2 * bs, dtype=torch.int32, pin_memory=True)  # ok: FC107
        self.page_counts_cpu[:bs] = torch.from_numpy(pages)
        indptr = self.bufs.kv_indptr_cpu.numpy()
        assert indptr.dtype == np.int32  # ok: FC109
        indptr[0] = 0
        np.cumsum(pages, out=indptr[1 : bs + 1])
        self.bufs.kv_last_page_len_cpu[:bs] = torch.from_numpy((lens - 1) % page + 1)
        return int(indptr[bs])

    def _host_seq_lens(self, fb: ForwardBatch) -> torch.Tensor:
        if fb.seq_lens_cpu is not None:
            return fb.seq_lens_cpu
        return fb.seq_lens.cpu()  # expect: FC101

    def _fill_qo_indptr(self, bs: int, fb: ForwardBatch) -> None:
        qo = self.bufs.qo_indptr_cpu.numpy()
        qo[0] = 0
        np.cumsum(fb.extend_seq_lens_cpu, out=qo[1 : bs + 1])
        self.bufs.qo_indptr[: bs + 1].copy_(self.bufs.qo_indptr_cpu[: bs + 1], non_blocking=True)
        fb.qo_offsets = self.bufs.qo_indptr[: bs + 1].clone()  # ok: FC107

    def _upload_and_gather(self, bs: int, fb: ForwardBatch) -> None:
        self.bufs.kv_indptr[: bs + 1].copy_(self.bufs.kv_indptr_cpu[: bs + 1], non_blocking=True)
        self.bufs.kv_last_page_len[:bs].copy_(self.bufs.kv_last_page_len_cpu[:bs], non_blocking=True)
        gather_kv_indices(self.req_to_page, fb.req_pool_indices_cpu[:bs], self.page_counts_cpu[:bs], self.bufs.kv_indices)

    def _recipe_kwargs(self, recipe: PlanRecipe) -> Dict[str, object]:
        kwargs: Dict[str, object] = {"logits_soft_cap": self.soft_cap}
        if recipe is PlanRecipe.SWA_DECODE:
            kwargs["window_left"] = self.sliding_window - 1
        return kwargs

    def _run_recipes(self, mode: ForwardMode, fb: ForwardBatch) -> None:
        for recipe in RECIPES_BY_MODE[mode]:
            if recipe.feature not in self.features:
                continue
            wrapper = getattr(self, recipe.wrapper_attr)
            recipe.planner(wrapper, self.bufs, fb, self.heads, **self._recipe_kwargs(recipe))

    # ------------------------------------------------------------------ eager metadata

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        planner = getattr(self, f"_plan_{fb.forward_mode.name.lower()}")
        planner(fb)

    def _plan_idle(self, fb: ForwardBatch) -> None:
        """Idle ranks of a data-parallel group run no attention."""
        return None

    def _plan_decode(self, fb: ForwardBatch) -> None:
        bs = fb.batch_size
        self._decode_max_seq_len = int(fb.seq_lens_cpu[:bs].max())  # ok: FC101
        self._fill_host_mirrors(bs, fb.seq_lens_cpu)
        self._upload_and_gather(bs, fb)
        self._run_recipes(ForwardMode.DECODE, fb)
        plan_info = operator.attrgetter("_plan_info")(self.decode_wrapper)  # expect: FC103
        self._plan_info = (ForwardMode.DECODE, bs, plan_info)  # ok: FC103

    def _plan_extend(self, fb: ForwardBatch) -> None:
        bs = fb.batch_size
        self.use_ragged = not any(fb.extend_prefix_lens_cpu or ())
        self._extend_max_q = fb.extend_seq_lens.max().item()  # expect: FC101
        self._fill_host_mirrors(bs, fb.seq_lens_cpu)
        self._fill_qo_indptr(bs, fb)
        self._upload_and_gather(bs, fb)
        if self.use_ragged:
            self.prefill_wrapper_ragged.plan(  # expect: FC102
                self.bufs.qo_indptr[: bs + 1],
                self.bufs.qo_indptr[: bs + 1],
                *self.heads.shape_args()[:3],
                causal=True,
                logits_soft_cap=self.soft_cap,
                q_data_type=self.heads.dtype,
            )
            return
        self._run_recipes(ForwardMode.EXTEND, fb)

    def _plan_mixed(self, fb: ForwardBatch) -> None:
        """Chunked prefill mixed with decodes: every request has a prefix, so only the paged wrapper runs."""
        bs = fb.batch_size
        self.use_ragged = False
        self._fill_host_mirrors(bs, fb.seq_lens_cpu)
        self._fill_qo_indptr(bs, fb)
        self._upload_and_gather(bs, fb)
        plan_paged = operator.methodcaller(  # expect: FC102
            "plan",
            self.bufs.qo_indptr_cpu[: bs + 1],
            self.bufs.kv_indptr[: bs + 1],
            self.bufs.kv_indices,
            self.bufs.kv_last_page_len_cpu[:bs],
            *self.heads.shape_args(),
            causal=True,
            logits_soft_cap=self.soft_cap,
            q_data_type=self.heads.dtype,
            kv_data_type=self.heads.dtype,
        )
        plan_paged(self.prefill_wrapper_paged)

    def _plan_target_verify(self, fb: ForwardBatch) -> None:
        bs = fb.batch_size
        n = self.cfg.num_draft_tokens
        self._fill_host_mirrors(bs, self._host_seq_lens(fb))
        self.bufs.qo_indptr_cpu[: bs + 1] = torch.arange(0, (bs + 1) * n, n, dtype=torch.int32)
        self.bufs.qo_indptr[: bs + 1].copy_(self.bufs.qo_indptr_cpu[: bs + 1], non_blocking=True)
        self._upload_and_gather(bs, fb)
        self._replay_plan_verify(fb)

    def _stage_custom_mask(self, fb: ForwardBatch) -> None:
        """Keep the drafter's tree mask alive in our own buffer until the verify run has read it."""
        if fb.custom_mask is None:
            return
        mask_len = int(fb.custom_mask.numel())  # ok: FC101
        if self.custom_mask_buf is None:
            self.custom_mask_buf = torch.empty(mask_len, dtype=torch.bool, device=self.device)  # ok: FC107
        elif self.custom_mask_buf.numel() < mask_len:
            self.custom_mask_buf.resize_(mask_len)  # expect: FC107
        self.custom_mask_buf[:mask_len].copy_(fb.custom_mask.view(-1))
        fb.custom_mask = self.custom_mask_buf[:mask_len]

    # ------------------------------------------------------------------ graphs: capture and replay

    def init_forward_metadata_capture_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        self.bufs.kv_last_page_len[:bs].fill_(1)  # ok: FC104
        self.bufs.kv_last_page_len_cpu[:bs].fill_(1)
        self.bufs.kv_indptr_cpu[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
        match fb.forward_mode:
            case ForwardMode.DECODE:
                wrapper = BatchDecodeWithPagedKVCacheWrapper(
                    self.graph_workspace,
                    self._kv_layout,  # ok: FC103
                    use_cuda_graph=True,
                    paged_kv_indptr_buffer=self.bufs.kv_indptr[: bs + 1],
                    paged_kv_indices_buffer=self.bufs.kv_indices,
                    paged_kv_last_page_len_buffer=self.bufs.kv_last_page_len[:bs],
                    backend="fa2",
                )
                self.graph_slots[bs] = PlanSlot(ForwardMode.DECODE, bs, wrapper)
                plan_paged_decode(wrapper, self.bufs, fb, self.heads, logits_soft_cap=self.soft_cap)
            case ForwardMode.TARGET_VERIFY:
                self._plan_target_verify(fb)
            case _:
                raise ValueError(f"{fb.forward_mode.name} batches are not recorded")

    def prepare_graph_step(self, fb: ForwardBatch) -> None:
        """Refresh the graph-bound index buffers for one replay and plan the recorded wrapper."""
        bs, pad = fb.batch_size, fb.padded_batch_size
        total = self._fill_host_mirrors(bs, self._host_seq_lens(fb))
        if total > self.bufs.kv_indices.numel():
            self.bufs.kv_indices = torch.zeros(2 * total, dtype=torch.int32, device=self.device)  # expect: FC107
        self.bufs.kv_indptr_cpu[bs + 1 : pad + 1] = total
        self.bufs.kv_indptr[: pad + 1].copy_(self.bufs.kv_indptr_cpu[: pad + 1], non_blocking=True)  # ok: FC104
        gather_kv_indices(self.req_to_page, fb.req_pool_indices_cpu[:bs], self.page_counts_cpu[:bs], self.bufs.kv_indices)
        self._replay_planners[(fb.forward_mode, True)](fb)
        if pad > bs:
            # Padded requests attend one dummy token each.
            self.bufs.kv_last_page_len[bs:pad].fill_(1)  # expect: FC104

    def _replay_plan_decode(self, fb: ForwardBatch) -> None:
        slot = self.graph_slots[fb.padded_batch_size]
        pad = slot.batch_size
        total = int(self.bufs.kv_indptr_cpu[pad])
        slot_plan(slot)(  # ok: FC102
            self.bufs.kv_indptr_cpu[: pad + 1],
            self.bufs.kv_indices[:total],
            self.bufs.kv_last_page_len_cpu[:pad],
            *self.heads.shape_args(),
            logits_soft_cap=self.soft_cap,
            q_data_type=self.heads.dtype,
            kv_data_type=self.heads.dtype,
        )

    def _replay_plan_verify(self, fb: ForwardBatch) -> None:
        self._stage_custom_mask(fb)
        self._run_recipes(ForwardMode.TARGET_VERIFY, fb)

    # ------------------------------------------------------------------ after the step

    def _advance_decode_lengths(self, fb: ForwardBatch) -> None:
        """Every decoded request now holds one more token: keep the page lengths current between steps, so a
        graph replay of an unchanged decode batch can skip re-planning (see ModelRunner._run_graph)."""
        bs = fb.batch_size
        page = self.cfg.page_size
        last = self.bufs.kv_last_page_len[:bs]
        last.remainder_(page).add_(1)  # expect: FC104
        self.bufs.kv_last_page_len_cpu[:bs].remainder_(page).add_(1)  # ok: FC104

    # ------------------------------------------------------------------ forward

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: "RadixAttention", fb: ForwardBatch
    ) -> torch.Tensor:
        handler = self._forward_table[(fb.forward_mode, fb.use_graph)]
        return handler(q, k, v, layer, fb)

    def _select_decode_wrapper(self, fb: ForwardBatch) -> BatchDecodeWithPagedKVCacheWrapper:
        match fb.forward_mode:
            case ForwardMode.DECODE if fb.use_graph:
                return self.graph_slots[fb.padded_batch_size].wrapper
            case _:
                return self.decode_wrapper

    def _trtllm_decode(self, q, kv, fb: ForwardBatch, layer: "RadixAttention", max_seq_len: int) -> torch.Tensor:
        return trtllm_batch_decode_with_kv_cache(
            query=q,
            kv_cache=kv,
            workspace_buffer=self.trtllm_workspace,
            block_tables=self.req_to_page[fb.req_pool_indices],
            seq_lens=fb.seq_lens,
            max_seq_len=max_seq_len,
            bmm1_scale=layer.scaling,
            bmm2_scale=1.0,
            window_left=layer.window_left,
        )

    def _forward_decode_eager(self, q, k, v, layer: "RadixAttention", fb: ForwardBatch) -> torch.Tensor:
        kv = layer.pool.layer(layer.layer_id)
        if Feature.TRTLLM_DECODE in self.features:
            return self._trtllm_decode(q, kv, fb, layer, self._decode_max_seq_len)
        use_swa = layer.is_sliding and Feature.SLIDING_WINDOW in self.features
        wrapper = self.swa_decode_wrapper if use_swa else self.decode_wrapper
        return wrapper.run(q, kv)  # ok: FC108

    def _forward_decode_graph(self, q, k, v, layer: "RadixAttention", fb: ForwardBatch) -> torch.Tensor:
        kv = layer.pool.layer(layer.layer_id)
        if Feature.TRTLLM_DECODE in self.features:
            max_seq_len = int(fb.seq_lens.max())  # expect: FC101
            return self._trtllm_decode(q, kv, fb, layer, max_seq_len)
        if layer.is_sliding and Feature.SLIDING_WINDOW in self.features:
            return self.swa_decode_wrapper.run(q, kv)  # expect: FC108
        wrapper = self._select_decode_wrapper(fb)
        return wrapper.run(q, kv)  # ok: FC108

    def _forward_extend(self, q, k, v, layer: "RadixAttention", fb: ForwardBatch) -> torch.Tensor:
        kv = layer.pool.layer(layer.layer_id)
        if int(fb.extend_seq_lens.sum()) != q.shape[0]:  # expect: FC101
            raise RuntimeError(f"extend batch holds {q.shape[0]} tokens, not what the scheduler planned")
        if Feature.TRTLLM_DECODE in self.features and not self.use_ragged:
            bs = fb.batch_size
            cum_kv = torch.nn.functional.pad(torch.cumsum(fb.seq_lens, 0, dtype=torch.int32), (1, 0))
            return trtllm_batch_context_with_kv_cache(
                q,
                kv,
                self.trtllm_ctx_workspace,
                self.req_to_page[fb.req_pool_indices],
                fb.seq_lens,
                self._extend_max_q,
                self.cfg.max_context_len,
                layer.scaling,
                1.0,
                bs,
                self.bufs.qo_indptr[: bs + 1],
                cum_kv,
            )
        if self.use_ragged:
            return self.prefill_wrapper_ragged.run(q, k, v)  # ok: FC108
        return self.prefill_wrapper_paged.run(q, kv)  # ok: FC108

    def _forward_verify(self, q, k, v, layer: "RadixAttention", fb: ForwardBatch) -> torch.Tensor:
        kv = layer.pool.layer(layer.layer_id)
        match fb.forward_mode:
            case ForwardMode.TARGET_VERIFY:
                wrapper = self.verify_wrapper
            case _:
                wrapper = self.prefill_wrapper_paged
        return wrapper.run(q, kv)  # expect: FC108
