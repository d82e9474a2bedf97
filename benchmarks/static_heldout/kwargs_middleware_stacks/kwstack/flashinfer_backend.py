"""FlashInfer attention backend (SGLang-shaped) whose wrappers are built and planned from keyword bags."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Optional

import torch
from flashinfer import BatchPrefillWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper

from kwstack.forward_batch import ForwardBatch
from kwstack.indices_updater import (
    FlashInferIndicesUpdaterDecode,
    FlashInferIndicesUpdaterPrefill,
    create_flashinfer_kv_indices_triton,
)
from kwstack.plan_kwargs import make_decode_wrapper, prebind_plan
from kwstack_ops.workspace import decode_workspace_bytes, ragged_workspace
from kwstack_ops.wrapper_compat import PLAN_STATE_FIELDS, get_cached_module, snapshot_plan_state

if TYPE_CHECKING:
    from kwstack.config import ServerArgs


@dataclass
class DecodeMetadata:
    decode_wrappers: List[Any]


@dataclass
class PrefillMetadata:
    prefill_wrapper: Any
    use_ragged: bool


class FlashInferAttnBackend:
    def __init__(self, server_args: "ServerArgs", req_to_token: torch.Tensor, kv_cache: torch.Tensor):
        sa = server_args
        self.device = torch.device(sa.device)
        self.num_qo_heads = sa.num_qo_heads
        self.num_kv_heads = sa.num_kv_heads
        self.head_dim = sa.head_dim
        self.page_size = sa.page_size
        self.q_dtype = torch.bfloat16
        self.kv_dtype = torch.bfloat16
        self.debug_checks = False
        self.req_to_token = req_to_token
        self.kv_cache = kv_cache
        max_bs = sa.max_running_requests

        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_indices = torch.zeros(sa.max_total_tokens, dtype=torch.int32, device=self.device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        self.kv_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.qo_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.qo_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.cu_seqlens_q: Optional[torch.Tensor] = None
        self.token_to_req: Optional[torch.Tensor] = None
        self.token_kv_start: Optional[torch.Tensor] = None

        # Prefill and ragged wrappers share the main workspace, sized by configuration.
        self.workspace = torch.zeros(sa.workspace_bytes, dtype=torch.uint8, device=self.device)  # ok: FC106
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD")
        self.ragged_wrapper = BatchPrefillWithRaggedKVCacheWrapper(ragged_workspace(self.device), "NHD")

        # The decode kernel is a deployment choice; its keywords travel with every decode wrapper we build.
        self.decode_kernel_kwargs: Dict[str, Any] = (
            {"backend": "trtllm-gen"} if sa.decode_kernel == "trtllm-gen" else {"backend": "fa2"}
        )
        self.decode_workspace = torch.empty(sa.workspace_bytes, dtype=torch.uint8, device=self.device)  # expect: FC105
        self.decode_wrappers = [make_decode_wrapper(self.decode_workspace, "NHD", **self.decode_kernel_kwargs)]

        # Soft-capped and sliding-window layers get their own eager FA2 wrappers.
        eager_bytes = decode_workspace_bytes(max_bs, sa.num_qo_heads, sa.head_dim)
        self.eager_workspace = torch.empty(eager_bytes, dtype=torch.uint8, device=self.device)  # ok: FC105
        self.eager_kwargs = dict(use_tensor_cores=True, backend="fa2")
        self.softcap_wrapper = make_decode_wrapper(self.eager_workspace, "NHD", **self.eager_kwargs)
        self.window_wrapper = make_decode_wrapper(self.eager_workspace, "NHD", **self.eager_kwargs)

        self.graph_wrappers: Dict[int, Any] = {}
        self.graph_plan_fns: Dict[int, Any] = {}
        self._plan_info: Dict[int, tuple] = {}
        self.forward_metadata: Any = None

        self.indices_updater_decode = FlashInferIndicesUpdaterDecode(self)
        self.indices_updater_prefill = FlashInferIndicesUpdaterPrefill(self)

    # ------------------------------------------------------------------ helpers
    def ensure_capacity(self, **sizes: int) -> None:
        """Grow the named index buffers to at least the given number of entries."""
        for name, needed in sizes.items():
            buf = getattr(self, name)
            if buf.numel() < needed:
                setattr(self, name, torch.empty(needed * 2, dtype=buf.dtype, device=buf.device))  # expect: FC107

    def _graph_wrapper_kwargs(self, bs: int) -> Dict[str, Any]:
        return dict(
            use_cuda_graph=True,
            paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.kv_indices,
            paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
        )

    def plan_fingerprint(self, bs: int) -> tuple:
        state = snapshot_plan_state(self.graph_wrappers[bs], *PLAN_STATE_FIELDS)
        return tuple(sorted(state))

    # ------------------------------------------------------------------ per step
    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        if fb.forward_mode.is_decode():
            wrappers = self.decode_wrappers + [self.softcap_wrapper, self.window_wrapper]
            self.indices_updater_decode.update(fb.req_pool_indices, fb.seq_lens, fb.seq_lens_cpu, wrappers)
            self.forward_metadata = DecodeMetadata(decode_wrappers=self.decode_wrappers)
        else:
            prefix_lens = fb.extend_prefix_lens_cpu or []
            use_ragged = not any(prefix_lens)
            self.indices_updater_prefill.update(fb, self.prefill_wrapper, self.ragged_wrapper, use_ragged)
            self.forward_metadata = PrefillMetadata(self.prefill_wrapper, use_ragged)

    # ------------------------------------------------------------------ graphs
    def init_cuda_graph_state(self, max_bs: int, capture_bs: List[int]) -> None:
        self.kv_last_page_len.fill_(1)  # ok: FC104
        for bs in capture_bs:
            w = make_decode_wrapper(
                self.decode_workspace, "NHD", **self.decode_kernel_kwargs, **self._graph_wrapper_kwargs(bs)
            )
            self.graph_wrappers[bs] = w
            self.graph_plan_fns[bs] = prebind_plan(w, **self.indices_updater_decode.plan_defaults)
        # Touch the JIT module once so the first capture does not compile inside the graph pool.
        module = get_cached_module(self.decode_wrappers[0])  # expect: FC103
        if module is None:
            raise RuntimeError("decode wrapper has no compiled module; was it planned?")

    def init_forward_metadata_capture_cuda_graph(self, bs: int, req_pool_indices, seq_lens, seq_lens_cpu, fb=None):
        w = self.graph_wrappers[bs]
        self.indices_updater_decode.update(req_pool_indices, seq_lens, seq_lens_cpu, [w])
        self.forward_metadata = DecodeMetadata(decode_wrappers=[w])

    def init_forward_metadata_replay_cuda_graph(
        self, bs: int, raw_bs: int, req_pool_indices, seq_lens, seq_lens_cpu, **kwargs
    ) -> None:
        self.kv_indptr_cpu[1 : raw_bs + 1] = torch.cumsum(seq_lens_cpu[:raw_bs], dim=0)
        self.kv_indptr_cpu[raw_bs + 1 : bs + 1] = self.kv_indptr_cpu[raw_bs]
        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_cpu[: bs + 1], non_blocking=True)  # ok: FC104
        create_flashinfer_kv_indices_triton[(raw_bs,)](
            self.req_to_token, req_pool_indices, self.kv_indptr, None, self.kv_indices, self.req_to_token.shape[1]
        )
        if self.cu_seqlens_q is None:
            self.cu_seqlens_q = torch.arange(0, bs + 1, dtype=torch.int32, device=self.device)  # ok: FC107
        plan = self.graph_plan_fns[bs]
        plan(self.kv_indptr_cpu[: bs + 1], self.kv_indices, self.kv_last_page_len_cpu[:bs])  # ok: FC102
        self._plan_info[bs] = (raw_bs, int(self.kv_indptr_cpu[raw_bs]))  # ok: FC103
        if kwargs.get("reset_padding", True) and raw_bs < bs:
            self.kv_last_page_len[raw_bs:bs].fill_(1)  # expect: FC104
        self.kv_indptr_cpu[bs + 1 :].zero_()  # ok: FC104
        self.forward_metadata = DecodeMetadata(decode_wrappers=[self.graph_wrappers[bs]])

    # ------------------------------------------------------------------ forward
    def forward(self, q, k, v, layer, fb: ForwardBatch, **kwargs):
        if fb.forward_mode.is_decode():
            return self.forward_decode(q, k, v, layer, fb, **kwargs)
        return self.forward_extend(q, k, v, layer, fb, **kwargs)

    def forward_decode(self, q, k, v, layer, fb: ForwardBatch, **kwargs):
        kv = self.kv_cache[layer.layer_id]
        if layer.logit_cap > 0:
            return self._forward_softcap(q, kv, layer=layer, **kwargs)
        if layer.sliding_window_size > 0:
            return self._forward_window(q, kv, layer=layer, fb=fb, **kwargs)
        if not fb.use_graph:
            return self.decode_wrappers[0].run(q, kv)  # ok: FC108
        return self.graph_wrappers[fb.batch_size].run(q, kv)

    def _forward_softcap(self, q, kv, **kwargs):
        return self.softcap_wrapper.run(q, kv)  # expect: FC108

    def _forward_window(self, q, kv, **kwargs):
        layer, fb = kwargs["layer"], kwargs["fb"]
        bs = fb.batch_size
        clipped = torch.clamp(fb.seq_lens, max=layer.sliding_window_size)
        torch.cumsum(clipped, dim=0, out=self.kv_indptr[1 : bs + 1])  # expect: FC104
        return self.window_wrapper.run(q, kv)  # expect: FC108

    def forward_extend(self, q, k, v, layer, fb: ForwardBatch, **kwargs):
        md = self.forward_metadata
        kv = self.kv_cache[layer.layer_id]
        if md.use_ragged:
            return self.ragged_wrapper.run(q, k, v)  # ok: FC108
        return md.prefill_wrapper.run(q, kv)  # ok: FC108
