"""FlashInfer attention backend (eager wrappers + per-bucket CUDA-graph decode wrappers).

All FlashInfer classes and functions come from :mod:`compatserve.compat`; the backend itself
never looks at the FlashInfer version except through the flags compat exports.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, Optional, Tuple

import torch

from compatserve import compat
from compatserve.attention import planning
from compatserve.config import EngineConfig
from compatserve.forward_batch import ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from compatserve.model import KVPool, RadixAttention

logger = logging.getLogger(__name__)


@dataclass
class DecodeMetadata:
    decode_wrapper: Any
    bs: int


class FlashInferAttnBackend:
    def __init__(self, cfg: EngineConfig, kv_pool: "KVPool", req_to_page: torch.Tensor):
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self.kv_pool = kv_pool
        self.req_to_page = req_to_page
        self.page_size = cfg.page_size
        self.max_pages_per_req = cfg.max_pages_per_req
        self.use_tensor_cores = cfg.use_tensor_cores and cfg.num_qo_heads // cfg.num_kv_heads >= 4

        self.use_trtllm_gen = compat.HAS_TRTLLM_GEN and cfg.decode_backend == "trtllm"
        self.trtllm_raw = compat.trtllm_batch_decode_with_kv_cache is not None and cfg.decode_backend == "trtllm-raw"
        decode_backend = "trtllm-gen" if self.use_trtllm_gen else "fa2"

        # workspaces
        self.decode_workspace = torch.empty(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=self.device)  # expect: FC105
        self.prefill_workspace = torch.empty(compat.DEFAULT_WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)  # expect: FC106
        self.window_workspace = torch.empty(cfg.window_workspace_bytes, dtype=torch.uint8, device=self.device)  # ok: FC105
        if self.trtllm_raw:
            self.trtllm_workspace = torch.empty(self._trtllm_workspace_bytes(), dtype=torch.uint8, device=self.device)  # expect: FC105

        # eager wrappers
        self.decode_wrapper = compat.make_decode_wrapper(
            self.decode_workspace,
            "HND" if self.use_trtllm_gen else "NHD",
            backend=decode_backend,
            use_tensor_cores=self.use_tensor_cores,
        )
        self.window_decode_wrapper = compat.make_decode_wrapper(
            self.window_workspace, "NHD", backend="fa2", use_tensor_cores=self.use_tensor_cores
        )
        self.prefill_wrapper = compat.PrefillWrapper(self.prefill_workspace, "NHD")
        self.ragged_wrapper = compat.RaggedPrefillWrapper(self.prefill_workspace, "NHD")

        # 0.1.6's graph-mode decode kernels ignore logits_soft_cap at run(): soft-capped layers
        # go through a plain wrapper of their own.
        self.softcap_decode_wrapper = None
        if not compat.PLAN_RUN_API and cfg.logit_cap > 0:
            self.softcap_workspace = torch.zeros(max(compat.MIN_WORKSPACE_BYTES, cfg.max_batch_size * cfg.num_qo_heads * (cfg.head_dim + 1) * 4 * 32), dtype=torch.uint8, device=self.device)  # ok: FC106
            self.softcap_decode_wrapper = compat.DecodeWrapper(self.softcap_workspace, "NHD")

        # JIT builds (>= 0.2 without AOT kernels) compile the prefill module on the first plan().
        self.needs_jit_warmup = compat.PLAN_RUN_API and not hasattr(self.prefill_wrapper, "_cached_module")  # expect: FC103

        # eager index buffers (device); the eager wrappers copy what plan() is given
        max_bs = cfg.max_batch_size
        i32 = dict(dtype=torch.int32, device=self.device)
        self.kv_indptr = torch.zeros(max_bs + 1, **i32)
        self.kv_indices = torch.zeros(max_bs * self.max_pages_per_req, **i32)
        self.window_kv_indptr = torch.zeros(max_bs + 1, **i32)
        self.window_kv_indices = torch.zeros(max_bs * self.max_pages_per_req, **i32)
        self.window_kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)

        self.graph_decode_wrappers: Dict[int, Any] = {}
        self._plan_info: Dict[int, Tuple[int, int]] = {}
        self.forward_metadata: Optional[DecodeMetadata] = None

    def _trtllm_workspace_bytes(self) -> int:
        # counters + partial outputs for one CTA group per SM-sized tile of the largest batch
        return self.cfg.max_batch_size * self.cfg.num_qo_heads * self.cfg.head_dim * 4 * 8 + (8 << 20)

    # ------------------------------------------------------------------------------------
    # eager metadata
    # ------------------------------------------------------------------------------------

    @compat.traced_plan
    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        if fb.forward_mode.is_decode():
            self._init_decode_metadata(fb)
        else:
            self._init_extend_metadata(fb)

    def _init_decode_metadata(self, fb: ForwardBatch) -> None:
        bs = fb.batch_size
        ps = self.page_size
        pages = (fb.seq_lens + ps - 1) // ps
        pages_cpu = (fb.seq_lens_cpu + ps - 1) // ps
        total = int(pages_cpu.sum())  # ok: FC101
        torch.cumsum(pages, 0, out=self.kv_indptr[1 : bs + 1])
        planning.gather_kv_indices(
            self.req_to_page, fb.req_pool_indices, pages, None, self.kv_indptr[: bs + 1], total, self.kv_indices
        )
        last_page_len_cpu = (fb.seq_lens_cpu - 1) % ps + 1

        kw = planning.decode_plan_kwargs(
            self.cfg, self.kv_indptr[: bs + 1], self.kv_indices[:total], last_page_len_cpu
        )
        params = compat.plan_params(self.decode_wrapper)
        planning.add_split_kv_kwargs(kw, params, fb.seq_lens.max().item(), self.cfg)  # expect: FC101
        self.decode_wrapper.plan(**compat.filter_plan_kwargs(self.decode_wrapper, kw))  # expect: FC102

        if self.cfg.window_layers:
            self._plan_window(fb, bs)
        if self.softcap_decode_wrapper is not None:
            self._plan_side_wrappers_host(bs, fb.req_pool_indices, fb.seq_lens, fb.seq_lens_cpu, window=False)
        self.forward_metadata = DecodeMetadata(self.decode_wrapper, bs)

    def _plan_window(self, fb: ForwardBatch, bs: int) -> None:
        ps = self.page_size
        win = self.cfg.sliding_window
        pages = (fb.seq_lens + ps - 1) // ps
        win_pages = (torch.clamp(fb.seq_lens, max=win) + ps - 1) // ps
        win_pages_cpu = (torch.clamp(fb.seq_lens_cpu, max=win) + ps - 1) // ps
        win_total = int(win_pages_cpu.sum())
        torch.cumsum(win_pages, 0, out=self.window_kv_indptr[1 : bs + 1])
        planning.gather_kv_indices(
            self.req_to_page, fb.req_pool_indices, win_pages, pages - win_pages,
            self.window_kv_indptr[: bs + 1], win_total, self.window_kv_indices,
        )
        last_page_len_cpu = (fb.seq_lens_cpu - 1) % ps + 1
        self.window_decode_wrapper.plan(self.window_kv_indptr[: bs + 1], self.window_kv_indices[:win_total], last_page_len_cpu, self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim, ps, window_left=win - 1, q_data_type=self.cfg.dtype)  # expect: FC102
        self.window_kv_indptr[bs + 1 :].fill_(win_total)  # ok: FC104

    def _plan_side_wrappers_host(
        self,
        bs: int,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        window: bool = True,
    ) -> None:
        """Plan the eager window / soft-cap wrappers from the pinned lengths only."""
        ps = self.page_size
        last_page_len_cpu = (seq_lens_cpu[:bs] - 1) % ps + 1
        if window and self.cfg.window_layers:
            win = self.cfg.sliding_window
            win_pages_cpu = (torch.clamp(seq_lens_cpu[:bs], max=win) + ps - 1) // ps
            indptr_cpu = self.window_kv_indptr_cpu[: bs + 1]
            torch.cumsum(win_pages_cpu, 0, out=indptr_cpu[1:])
            win_total = int(indptr_cpu[-1])  # ok: FC101
            pages = (seq_lens[:bs] + ps - 1) // ps
            win_pages = (torch.clamp(seq_lens[:bs], max=win) + ps - 1) // ps
            self.window_kv_indptr[: bs + 1].copy_(indptr_cpu, non_blocking=True)
            planning.gather_kv_indices(
                self.req_to_page, req_pool_indices[:bs], win_pages, pages - win_pages,
                self.window_kv_indptr[: bs + 1], win_total, self.window_kv_indices,
            )
            kw = planning.decode_plan_kwargs(
                self.cfg, indptr_cpu, self.window_kv_indices[:win_total], last_page_len_cpu, window_left=win - 1
            )
            self.window_decode_wrapper.plan(**compat.filter_plan_kwargs(self.window_decode_wrapper, kw))  # ok: FC102
        if self.softcap_decode_wrapper is not None:
            pages_cpu = (seq_lens_cpu[:bs] + ps - 1) // ps
            indptr_cpu = torch.zeros(bs + 1, dtype=torch.int32, pin_memory=True)
            torch.cumsum(pages_cpu, 0, out=indptr_cpu[1:])
            total = int(indptr_cpu[-1])
            pages = (seq_lens[:bs] + ps - 1) // ps
            self.kv_indptr[: bs + 1].copy_(indptr_cpu, non_blocking=True)
            planning.gather_kv_indices(
                self.req_to_page, req_pool_indices[:bs], pages, None, self.kv_indptr[: bs + 1], total, self.kv_indices
            )
            kw = planning.decode_plan_kwargs(
                self.cfg, indptr_cpu, self.kv_indices[:total], last_page_len_cpu, logits_soft_cap=self.cfg.logit_cap
            )
            self.softcap_decode_wrapper.plan(**compat.filter_plan_kwargs(self.softcap_decode_wrapper, kw))

    def _init_extend_metadata(self, fb: ForwardBatch) -> None:
        bs = fb.batch_size
        ps = self.page_size
        # ragged part: the new tokens attend to themselves
        kw = planning.ragged_plan_kwargs(self.cfg, fb.qo_indptr_cpu, fb.qo_indptr_cpu)
        self.ragged_wrapper.plan(**compat.filter_plan_kwargs(self.ragged_wrapper, kw))  # ok: FC102
        if not fb.has_prefix:
            return
        # paged part: the new tokens attend to the cached prefix
        prefix_pages_cpu = (fb.prefix_lens_cpu + ps - 1) // ps
        kv_indptr_cpu = torch.zeros(bs + 1, dtype=torch.int32, pin_memory=True)
        torch.cumsum(prefix_pages_cpu, 0, out=kv_indptr_cpu[1:])
        total = int(kv_indptr_cpu[-1])
        prefix_pages = prefix_pages_cpu.to(self.device, non_blocking=True)
        self.kv_indptr[: bs + 1].copy_(kv_indptr_cpu, non_blocking=True)
        planning.gather_kv_indices(
            self.req_to_page, fb.req_pool_indices, prefix_pages, None, self.kv_indptr[: bs + 1], total, self.kv_indices
        )
        last_page_len_cpu = torch.where(fb.prefix_lens_cpu > 0, (fb.prefix_lens_cpu - 1) % ps + 1, 0).int()
        self._plan_paged_prefill(fb.qo_indptr, kv_indptr_cpu, self.kv_indices[:total], last_page_len_cpu)

    @compat.serialize_plans
    def _plan_paged_prefill(
        self,
        qo_indptr: torch.Tensor,
        kv_indptr: torch.Tensor,
        kv_indices: torch.Tensor,
        last_page_len: torch.Tensor,
    ) -> None:
        cfg = self.cfg
        # causal is a plan() argument from 0.2 on and a run() argument on 0.1.6
        extra = compat.filter_kwargs(compat.plan_params(self.prefill_wrapper), {"causal": False})
        self.prefill_wrapper.plan(qo_indptr, kv_indptr, kv_indices, last_page_len, cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size, **extra)  # expect: FC102

    # ------------------------------------------------------------------------------------
    # CUDA graphs
    # ------------------------------------------------------------------------------------

    def init_cuda_graph_state(self, max_bs: int) -> None:
        self.graph_workspace = torch.empty(compat.graph_workspace_bytes(), dtype=torch.uint8, device=self.device)  # expect: FC106
        i32 = dict(dtype=torch.int32, device=self.device)
        self.cuda_graph_kv_indptr = torch.zeros(max_bs + 1, **i32)
        self.cuda_graph_kv_indices = torch.zeros(max_bs * self.max_pages_per_req, **i32)
        self.cuda_graph_kv_last_page_len = torch.empty(max_bs, **i32)
        self.cuda_graph_kv_last_page_len.fill_(1)  # ok: FC104
        self.cuda_graph_kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.cuda_graph_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self._capture_kv_tokens: Dict[int, int] = {}

    def init_forward_metadata_capture_cuda_graph(
        self,
        bs: int,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        forward_mode: ForwardMode,
    ) -> None:
        # remembered so that replay logs can compare the planned KV against the captured one
        self._capture_kv_tokens[bs] = int(seq_lens.sum())  # expect: FC101
        w = compat.make_graph_decode_wrapper(
            self.graph_workspace,
            self.cuda_graph_kv_indptr[: bs + 1],
            self.cuda_graph_kv_indices,
            self.cuda_graph_kv_last_page_len[:bs],
            "NHD",
            backend="fa2",
            use_tensor_cores=self.use_tensor_cores,
        )
        self.graph_decode_wrappers[bs] = w

        ps = self.page_size
        indptr_cpu = self.cuda_graph_kv_indptr_cpu[: bs + 1]
        torch.cumsum((seq_lens_cpu[:bs] + ps - 1) // ps, 0, out=indptr_cpu[1:])
        self.cuda_graph_kv_indptr[: bs + 1].copy_(indptr_cpu, non_blocking=True)  # ok: FC104
        kw = planning.decode_plan_kwargs(
            self.cfg, indptr_cpu, self.cuda_graph_kv_indices, self.cuda_graph_last_page_len_cpu[:bs]
        )
        w.plan(**compat.filter_plan_kwargs(w, kw))
        self._plan_side_wrappers_host(bs, req_pool_indices, seq_lens, seq_lens_cpu)
        self.forward_metadata = DecodeMetadata(w, bs)

    def init_forward_metadata_replay_cuda_graph(
        self,
        bs: int,
        raw_bs: int,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        forward_mode: ForwardMode,
    ) -> None:
        w = self.graph_decode_wrappers[bs]
        ps = self.page_size
        if bs + 1 > self.cuda_graph_kv_indptr_cpu.numel():
            self.cuda_graph_kv_indptr_cpu = torch.zeros(bs + 1, dtype=torch.int32, pin_memory=True)  # ok: FC107
        indptr_cpu = self.cuda_graph_kv_indptr_cpu[: bs + 1]
        pages_cpu = (seq_lens_cpu[:bs] + ps - 1) // ps
        torch.cumsum(pages_cpu, 0, out=indptr_cpu[1:])
        total = int(indptr_cpu[bs])  # ok: FC101
        self.cuda_graph_kv_indptr[: bs + 1].copy_(indptr_cpu, non_blocking=True)  # ok: FC104
        pages = (seq_lens[:bs] + ps - 1) // ps
        planning.gather_kv_indices(self.req_to_page, req_pool_indices[:bs], pages, None, self.cuda_graph_kv_indptr[: bs + 1], total, self.cuda_graph_kv_indices)  # ok: FC104
        last_cpu = self.cuda_graph_last_page_len_cpu[:bs]
        torch.remainder(seq_lens_cpu[:bs] - 1, ps, out=last_cpu)
        last_cpu += 1

        self._plan_side_wrappers_host(bs, req_pool_indices, seq_lens, seq_lens_cpu)
        if compat.fast_decode_plan is not None:
            kw = planning.decode_plan_kwargs(self.cfg, indptr_cpu, self.cuda_graph_kv_indices, last_cpu)
            planning.add_split_kv_kwargs(kw, compat.fast_plan_params(), int(seq_lens_cpu[:bs].max()), self.cfg)  # ok: FC101
            compat.fast_decode_plan(w, **compat.filter_kwargs(compat.fast_plan_params(), kw))  # ok: FC102
        else:
            # 0.1.6: no fast path; the CUDA-graph wrapper's begin_forward copies into its buffers
            last_page_len = (seq_lens[:bs] - 1) % ps + 1
            w.plan(indptr_cpu, self.cuda_graph_kv_indices, last_page_len.cpu(), self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim, ps)  # expect: FC101
        # the captured kernels read the last-page lengths from the bound buffer
        self.cuda_graph_kv_last_page_len[:bs].copy_(last_cpu, non_blocking=True)  # expect: FC104
        self._plan_info[bs] = (raw_bs, total)  # ok: FC103
        self.forward_metadata = DecodeMetadata(w, bs)

    # ------------------------------------------------------------------------------------
    # forward
    # ------------------------------------------------------------------------------------

    def forward_decode(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: "RadixAttention",
        fb: ForwardBatch,
        save_kv_cache: bool = True,
    ) -> torch.Tensor:
        if save_kv_cache:
            self.kv_pool.set_kv_buffer(layer.layer_id, fb.out_cache_loc, k, v)
        kv = self.kv_pool.get_kv_buffer(layer.layer_id)
        q = q.view(-1, layer.num_qo_heads, layer.head_dim)

        if self.softcap_decode_wrapper is not None and layer.logit_cap > 0:
            out = self.softcap_decode_wrapper.run(q, kv, logits_soft_cap=layer.logit_cap)  # expect: FC108
        elif layer.sliding_window > 0:
            out = self.window_decode_wrapper.run(q, kv)  # expect: FC108
        elif self.trtllm_raw:
            bs = fb.batch_size
            # block-table scratch: the graph indices buffer is max_bs * max_pages long (the
            # model runner refuses trtllm-raw without CUDA graphs, so it always exists)
            block_tables = self.cuda_graph_kv_indices[: bs * self.max_pages_per_req].view(bs, -1)
            torch.index_select(self.req_to_page, 0, fb.req_pool_indices, out=block_tables)  # expect: FC104
            out = compat.trtllm_batch_decode_with_kv_cache(
                query=q,
                kv_cache=kv,
                workspace_buffer=self.trtllm_workspace,
                block_tables=block_tables,
                seq_lens=fb.seq_lens,
                max_seq_len=self.cfg.max_context_len,
                bmm1_scale=layer.scaling,
                bmm2_scale=1.0,
            )
        else:
            out = self.forward_metadata.decode_wrapper.run(q, kv)  # ok: FC108
        return out.reshape(-1, layer.num_qo_heads * layer.head_dim)

    def forward_extend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: "RadixAttention",
        fb: ForwardBatch,
        save_kv_cache: bool = True,
    ) -> torch.Tensor:
        q = q.view(-1, layer.num_qo_heads, layer.head_dim)
        k = k.view(-1, layer.num_kv_heads, layer.head_dim)
        v = v.view(-1, layer.num_kv_heads, layer.head_dim)
        out, lse = self.ragged_wrapper.run_return_lse(q, k, v)
        if fb.has_prefix:
            kv = self.kv_pool.get_kv_buffer(layer.layer_id)
            out_prefix, lse_prefix = self.prefill_wrapper.run_return_lse(q, kv)  # ok: FC108
            out, _ = compat.merge_state(out, lse, out_prefix, lse_prefix)
        if save_kv_cache:
            self.kv_pool.set_kv_buffer(layer.layer_id, fb.out_cache_loc, k, v)
        return out.reshape(-1, layer.num_qo_heads * layer.head_dim)
