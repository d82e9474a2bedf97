"""Plan every wrapper the step's forward will run."""

from __future__ import annotations

from typing import Dict, Generator, Optional

import torch

from ..attention import AttentionBackend
from ..batch import StageEvent, StepMeta
from ..config import EngineConfig


class PlanStage:
    def __init__(self, cfg: EngineConfig, backend: AttentionBackend) -> None:
        self.cfg = cfg
        self.backend = backend
        self.device = torch.device(cfg.device)
        # the shape each eager wrapper was last planned for
        self._plan_info: Dict[str, tuple] = {}

    def _dims(self) -> tuple:
        cfg = self.cfg
        return cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size

    def plan_attention(self, meta: StepMeta) -> Generator[StageEvent, None, None]:
        if meta.is_prefill:
            yield from self._plan_prefill(meta)
            return
        cfg = self.cfg
        b = self.backend
        b.window_wrapper.plan(  # ok: FC102
            meta.kv_indptr_cpu,
            meta.kv_indices,
            meta.kv_last_page_len_cpu,
            *self._dims(),
            window_left=cfg.sliding_window - 1,
            **b.dtype_kwargs(),
        )
        if meta.bucket is not None:
            rows = meta.bucket
            b.kv_indptr[: rows + 1].copy_(meta.kv_indptr_cpu, non_blocking=True)  # ok: FC104
            wrapper = b.graph_wrappers[rows]
            wrapper.plan(  # ok: FC102
                meta.kv_indptr_cpu,
                meta.kv_indices,
                meta.kv_last_page_len_cpu,
                *self._dims(),
                **b.dtype_kwargs(),
            )
            b.kv_last_page_len[meta.batch_size : rows].fill_(1)  # expect: FC104
            b.kv_indptr_host[rows + 1 :].fill_(int(meta.kv_indptr_cpu[-1]))  # ok: FC104
        else:
            decode = b.long_decode_wrapper if meta.max_len >= cfg.long_context_len else b.decode_wrapper
            same_shape = self._plan_info.get("decode") == meta.shape_key  # ok: FC103
            if not (same_shape and decode._plan_info is not None):  # expect: FC103
                decode.plan(
                    meta.kv_indptr_cpu,
                    meta.kv_indices,
                    meta.kv_last_page_len_cpu,
                    *self._dims(),
                    **b.dtype_kwargs(),
                )
                self._plan_info["decode"] = meta.shape_key
        yield StageEvent("planned", meta.bucket)

    def _plan_prefill(self, meta: StepMeta) -> Generator[StageEvent, None, None]:
        cfg = self.cfg
        b = self.backend
        sp = meta.shared_prefix
        if sp is not None:
            last_shared = torch.full((1,), sp.last_page_len, dtype=torch.int32, device=self.device)
            b.cascade_wrapper.plan(  # expect: FC102
                [sp.qo_indptr_cpu, meta.qo_indptr_cpu],
                [sp.kv_indptr_cpu, meta.kv_indptr_cpu],
                [sp.kv_indices, meta.kv_indices],
                [last_shared, meta.kv_last_page_len_cpu],
                *self._dims(),
                causal=True,
                **b.dtype_kwargs(),
            )
        else:
            prefill = b.long_prefill_wrapper if meta.max_len >= cfg.long_context_len else b.prefill_wrapper
            prefill.plan(  # expect: FC102
                meta.qo_indptr,
                meta.kv_indptr_cpu,
                meta.kv_indices,
                meta.kv_last_page_len_cpu,
                *self._dims(),
                causal=True,
                **b.dtype_kwargs(),
            )
        yield StageEvent("planned", None)

    def last_planned(self, name: str) -> Optional[tuple]:
        return self._plan_info.get(name)
