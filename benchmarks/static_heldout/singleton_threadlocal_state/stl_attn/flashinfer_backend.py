"""FlashInfer attention for the worker threads.

There is one backend object per process (``FlashInferBackend.get_instance()``); it holds no per-step state.
Everything that belongs to a step (the wrappers the thread planned, the batch it runs, the bucket it is
recording) is read through ``ThreadState``, so the attention layers of a model shared by all threads of a
device stay stateless.
"""

from __future__ import annotations

import threading
from typing import ClassVar, FrozenSet, Optional, Tuple

import torch
from flashinfer import merge_state
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from stl_attn.kv_pool import KVPool
from stlserve.batch import ForwardBatch
from stlserve.config import EngineConfig
from stlserve.thread_state import ThreadState
from stlserve.workspace import WorkspaceManager
from stlserve.wrappers import ThreadWrappers, WrapperCache

KVCache = Tuple[torch.Tensor, torch.Tensor]


class FlashInferBackend:
    _instance: ClassVar[Optional["FlashInferBackend"]] = None
    _lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def get_instance(cls) -> "FlashInferBackend":
        inst = cls._instance
        if inst is None:
            with cls._lock:
                if cls._instance is None:
                    cls._instance = cls(EngineConfig.get_instance())
                inst = cls._instance
        return inst

    def __init__(self, cfg: EngineConfig) -> None:
        self.cfg = cfg
        self._kv_layout = "NHD"  # ok: FC103
        self.sm_scale = cfg.head_dim**-0.5
        self.window_layers: FrozenSet[int] = frozenset(cfg.window_layers)
        self.softcap_layers: FrozenSet[int] = frozenset(cfg.softcap_layers)
        self.draft_enabled = cfg.num_draft_tokens > 0

    @property
    def kv_layout(self) -> str:
        return self._kv_layout

    # -- per-step metadata (eager steps; graph steps are planned by the thread's ThreadGraphRunner) -------------

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        tw = ThreadState.wrappers()
        if batch.is_decode:
            self._plan_decode(tw, batch)
        else:
            self._plan_extend(tw, batch)

    def _plan_decode(self, tw: ThreadWrappers, batch: ForwardBatch) -> None:
        cfg = self.cfg
        max_kv = batch.seq_lens.max().item()  # expect: FC101
        tw.decode.plan(  # ok: FC102
            batch.kv_indptr_cpu,
            batch.kv_indices,
            batch.kv_last_page_len_cpu,
            cfg.num_q_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            q_data_type=cfg.dtype,
            kv_data_type=cfg.dtype,
        )
        tw.record_plan("decode", batch.batch_size, int(max_kv))
        if self.window_layers:
            tw.window.plan(  # expect: FC102
                batch.kv_indptr,
                batch.kv_indices,
                batch.kv_last_page_len_cpu,
                cfg.num_q_heads,
                cfg.num_kv_heads,
                cfg.head_dim,
                cfg.page_size,
                window_left=cfg.sliding_window - 1,
                q_data_type=cfg.dtype,
                kv_data_type=cfg.dtype,
            )
        if self.softcap_layers:
            WrapperCache.softcap_decode().plan(  # ok: FC102
                batch.kv_indptr_cpu,
                batch.kv_indices,
                batch.kv_last_page_len_cpu,
                cfg.num_q_heads,
                cfg.num_kv_heads,
                cfg.head_dim,
                cfg.page_size,
                logits_soft_cap=cfg.logits_soft_cap,
                q_data_type=cfg.dtype,
                kv_data_type=cfg.dtype,
            )
        if self.draft_enabled:
            self._plan_draft(tw)

    def _plan_draft(self, tw: ThreadWrappers) -> None:
        """The MTP head attends over the same pages as the step it drafts after."""
        cfg = self.cfg
        batch = ThreadState.current_batch()
        tw.draft.plan(  # expect: FC102
            batch.kv_indptr_cpu,
            batch.kv_indices,
            batch.kv_last_page_len,
            cfg.num_q_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            q_data_type=cfg.dtype,
            kv_data_type=cfg.dtype,
        )

    def _plan_extend(self, tw: ThreadWrappers, batch: ForwardBatch) -> None:
        cfg = self.cfg
        max_kv_host = int(batch.seq_lens_cpu.max())  # ok: FC101
        # new tokens attend to each other through the ragged wrapper ...
        WrapperCache.ragged_prefill().plan(  # expect: FC102
            batch.qo_indptr,
            batch.qo_indptr,
            cfg.num_q_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            causal=True,
            q_data_type=cfg.dtype,
        )
        # ... and to the cached prefix through the paged one; the two are merged by LSE
        WrapperCache.paged_prefill().plan(  # ok: FC102
            batch.qo_indptr_cpu,
            batch.kv_indptr_cpu,
            batch.kv_indices,
            batch.kv_last_page_len_cpu,
            cfg.num_q_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            causal=False,
            q_data_type=cfg.dtype,
            kv_data_type=cfg.dtype,
        )
        tw.record_plan("extend", batch.batch_size, max_kv_host)

    # -- forward ------------------------------------------------------------------------------------------------

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: ForwardBatch
    ) -> torch.Tensor:
        pool = KVPool.for_device(q.device)
        pool.store(layer_id, k, v, batch.out_cache_loc)
        kv = pool.layer(layer_id)
        if not batch.is_decode:
            return self.forward_extend(q, k, v, kv)
        if layer_id in self.window_layers:
            return self.forward_window(q, kv)
        if layer_id in self.softcap_layers:
            return WrapperCache.softcap_decode().run(q, kv)  # expect: FC108
        return self.forward_decode(q, kv, batch)

    def forward_decode(self, q: torch.Tensor, kv: KVCache, batch: ForwardBatch) -> torch.Tensor:
        cap_bs = ThreadState.capturing()
        if self.cfg.use_trtllm_decode and not cap_bs:
            return self._decode_trtllm(q, kv, batch)
        tw = ThreadState.wrappers()
        w = tw.graph_decode[cap_bs] if cap_bs else tw.decode
        return w.run(q, kv)  # ok: FC108

    def forward_window(self, q: torch.Tensor, kv: KVCache) -> torch.Tensor:
        return ThreadState.wrappers().window.run(q, kv)  # expect: FC108

    def forward_draft(self, q: torch.Tensor, kv: KVCache) -> torch.Tensor:
        tw = ThreadState.wrappers()
        return tw.draft.run(q, kv)  # expect: FC108

    def forward_extend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv: KVCache) -> torch.Tensor:
        o_new, lse_new = WrapperCache.ragged_prefill().run_return_lse(q, k, v)  # ok: FC108
        o_pre, lse_pre = WrapperCache.paged_prefill().run_return_lse(q, kv)  # ok: FC108
        o, _ = merge_state(o_new, lse_new, o_pre, lse_pre)
        return o

    def _decode_trtllm(self, q: torch.Tensor, kv: KVCache, batch: ForwardBatch) -> torch.Tensor:
        ws = WorkspaceManager.trtllm_scratch(q.device)
        return trtllm_batch_decode_with_kv_cache(
            query=q,
            kv_cache=kv,
            workspace_buffer=ws,
            block_tables=batch.block_tables,
            seq_lens=batch.seq_lens,
            max_seq_len=batch.max_seq_len,
            bmm1_scale=self.sm_scale,
            bmm2_scale=1.0,
        )
