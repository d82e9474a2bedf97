"""FlashInfer attention for mixed steps (eager) and decode-only steps (graphs per bucket)."""

import itertools
from typing import Dict, List

import torch
import torch.nn.functional as F
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer import trtllm_batch_context_with_kv_cache as trt_context

from ..config import BudgetConfig, WsClass
from ..request import SchedulerOutput
from ..step_meta import StepMetadata
from .kv_pool import PagedKVPool
from .workspaces import make_workspaces, wrapper_summary


class MixedFlashInferBackend:
    def __init__(self, cfg: BudgetConfig, meta: StepMetadata, pool: PagedKVPool) -> None:
        self.cfg = cfg
        self.meta = meta
        self.pool = pool
        self.ws = make_workspaces(cfg)
        self.prefill_workspace = torch.zeros(WsClass.LARGE.nbytes(), dtype=torch.uint8, device=cfg.device)  # expect: FC106
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, "NHD", backend="fa2")
        self.eager_decode = BatchDecodeWithPagedKVCacheWrapper(self.ws.decode, "NHD", use_tensor_cores=True)
        self.window_decode = BatchDecodeWithPagedKVCacheWrapper(self.ws.window, "NHD", use_tensor_cores=True)
        self.graph_decode: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.graph_decode_list: List[BatchDecodeWithPagedKVCacheWrapper] = []

    def _heads(self):
        c = self.cfg
        return c.num_qo_heads, c.num_kv_heads, c.head_dim, c.page_size

    def describe(self) -> List[str]:
        return [wrapper_summary(self.prefill_wrapper), wrapper_summary(self.eager_decode)]

    def check_layout(self) -> None:
        layout = self.pool._kv_layout  # ok: FC103
        for w in itertools.chain(self.graph_decode_list, [self.eager_decode, self.window_decode]):
            if w._kv_layout != layout:  # expect: FC103
                raise RuntimeError(f"wrapper layout differs from the pool's {layout}")

    # ---------------------------------------------------------------- graphs

    def init_cuda_graph_state(self, max_bs: int) -> None:
        self.meta.kv_indptr[: max_bs + 1].zero_()
        self.meta.kv_last_page_len[:max_bs].fill_(1)  # ok: FC104

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        m = self.meta
        h, kvh, d, page = self._heads()
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.ws.decode,
            "NHD",
            use_cuda_graph=True,
            use_tensor_cores=True,
            paged_kv_indptr_buffer=m.kv_indptr[: bs + 1],
            paged_kv_indices_buffer=m.kv_indices,
            paged_kv_last_page_len_buffer=m.kv_last_page_len[:bs],
        )
        m.kv_indptr_cpu[: bs + 1].copy_(torch.arange(bs + 1, dtype=torch.int32))
        m.kv_last_page_len_cpu[:bs].fill_(1)
        w.plan(m.kv_indptr_cpu[: bs + 1], m.kv_indices[:bs], m.kv_last_page_len_cpu[:bs], h, kvh, d, page,
               data_type=torch.bfloat16)
        self.window_decode.plan(m.kv_indptr_cpu[: bs + 1], m.kv_indices[:bs], m.kv_last_page_len_cpu[:bs], h, kvh, d,
                                page, data_type=torch.bfloat16, window_left=self.cfg.window)
        self.graph_decode[bs] = w
        self.graph_decode_list.append(w)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, out: SchedulerOutput) -> None:
        m = self.meta
        h, kvh, d, page = self._heads()
        real = out.num_decodes
        n = bs + 1
        total = int(out.kv_indptr_np[real])
        m.kv_indptr_cpu[: real + 1].copy_(torch.from_numpy(out.kv_indptr_np[: real + 1]))
        m.kv_indptr_cpu[real + 1 : n].fill_(total)
        m.kv_last_page_len_cpu[:real].copy_(torch.from_numpy(out.last_page_len_np[:real]))
        m.kv_last_page_len_cpu[real:bs].fill_(1)
        m.kv_indptr[:n].copy_(m.kv_indptr_cpu[:n], non_blocking=True)  # ok: FC104
        m.kv_indices[:total].copy_(torch.from_numpy(out.kv_indices_np[:total]), non_blocking=True)
        m.kv_last_page_len[:bs].copy_(m.kv_last_page_len_cpu[:bs], non_blocking=True)
        self.graph_decode[bs].plan(  # ok: FC102
            m.kv_indptr_cpu[:n], m.kv_indices[:total], m.kv_last_page_len_cpu[:bs], h, kvh, d, page,
            data_type=torch.bfloat16,
        )
        self.window_decode.plan(m.kv_indptr_cpu[:n], m.kv_indices[:total], m.kv_last_page_len_cpu[:bs], h, kvh, d,
                                page, data_type=torch.bfloat16, window_left=self.cfg.window)
        # keep the host mirror's tail monotone for the next, possibly larger, bucket
        m.kv_indptr_cpu[n:].fill_(total)  # ok: FC104

    # ---------------------------------------------------------------- mixed

    def init_forward_metadata(self, out: SchedulerOutput) -> None:
        m = self.meta
        m.fill(out)
        h, kvh, d, page = self._heads()
        nd, np_ = m.num_decodes, m.num_prefills
        if nd:
            self.eager_decode.plan(  # ok: FC102
                m.kv_indptr_cpu[: nd + 1], m.kv_indices, m.kv_last_page_len_cpu[:nd], h, kvh, d, page,
                data_type=torch.bfloat16,
            )
            self.window_decode.plan(m.kv_indptr_cpu[: nd + 1], m.kv_indices, m.kv_last_page_len_cpu[:nd], h, kvh, d,
                                    page, data_type=torch.bfloat16, window_left=self.cfg.window)
        if np_ and not self.cfg.use_trtllm_context:
            qo = m.qo_indptr_cpu[nd : nd + np_ + 1] - m.qo_indptr_cpu[nd]
            kv = m.kv_indptr_cpu[nd : nd + np_ + 1] - m.kv_indptr_cpu[nd]
            first = int(m.kv_indptr_cpu[nd])
            self.prefill_wrapper.plan(  # expect: FC102
                qo, kv, m.kv_indices[first:], m.kv_last_page_len[nd : nd + np_], h, kvh, d, page,
                causal=True, data_type=torch.bfloat16,
            )

    # --------------------------------------------------------------- forward

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> torch.Tensor:
        w = self.graph_decode[bs] if bs in self.graph_decode else self.eager_decode
        return w.run(q, kv_cache)  # ok: FC108

    def forward_decode_window(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.window_decode.run(q, kv_cache)  # expect: FC108

    def _context_trtllm(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        m = self.meta
        nd, np_ = m.num_decodes, m.num_prefills
        return trt_context(
            q,
            kv_cache,
            self.ws.context,
            m.block_tables[nd : nd + np_],
            m.seq_lens[nd : nd + np_],
            m.max_q_len,
            m.max_kv_len,
            self.cfg.head_dim ** -0.5,
            1.0,
            np_,
            m.qo_indptr[nd : nd + np_ + 1] - m.qo_indptr[nd],
            F.pad(torch.cumsum(m.seq_lens[nd : nd + np_], 0, dtype=torch.int32), (1, 0)),
        )

    def forward_mixed(self, q: torch.Tensor, kv_cache: torch.Tensor, window: bool) -> torch.Tensor:
        m = self.meta
        n_dec = m.num_decode_tokens
        q_dec = q[:n_dec]  # ok: FC101
        is_prefill_tok = m.token_kind[: m.num_tokens] == 1
        q_pf = q[: m.num_tokens][is_prefill_tok]  # expect: FC101
        out = torch.empty_like(q[: m.num_tokens])
        if n_dec:
            dec = self.window_decode if window else self.eager_decode
            out[:n_dec] = dec.run(q_dec, kv_cache)
        if m.num_prefill_tokens:
            if self.cfg.use_trtllm_context:
                out[n_dec:] = self._context_trtllm(q_pf, kv_cache)
            else:
                out[n_dec:] = self.prefill_wrapper.run(q_pf, kv_cache)
        return out
