"""Two-level cascade decode for a system prompt every request shares."""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from flashinfer import MultiLevelCascadeAttentionWrapper

from mroserve.batch import ForwardBatch
from mroserve.config import CASCADE_WORKSPACE_BYTES


class CascadeMixin:
    """Shared-prompt cascade.

    The KV pool pins the system prompt in its first ``shared_prefix_pages``
    pages: level 0 is the prompt (one KV range for the whole batch) and level 1
    each request's own pages. When the engine runs without a shared prompt every method forwards
    to ``super()``.
    """

    def __init__(self, cfg, device, **kwargs) -> None:
        super().__init__(cfg, device, **kwargs)
        self.shared_prefix_tokens = cfg.shared_prefix_tokens
        self.shared_prefix_pages = cfg.shared_prefix_tokens // cfg.page_size
        self.cascade_workspace = torch.zeros(CASCADE_WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)  # expect: FC106
        self.cascade_wrapper = MultiLevelCascadeAttentionWrapper(2, self.cascade_workspace, "NHD")
        self.prefix_kv_indices = torch.arange(max(self.shared_prefix_pages, 1), dtype=torch.int32, device=self.device)
        self.prefix_kv_indptr_cpu = torch.tensor([0, self.shared_prefix_pages], dtype=torch.int32)
        self.prefix_last_page_len_cpu = torch.tensor([cfg.page_size], dtype=torch.int32)
        self.decode_qo_indptr_cpu = torch.arange(cfg.max_batch_size + 1, dtype=torch.int32)
        self.prefix_lse: Optional[torch.Tensor] = None
        self._prefix_ok = False
        self._plan_info: Optional[Tuple[int, int]] = None

    def _plan_cascade(self, fb: ForwardBatch) -> None:
        cfg = self.cfg
        n = fb.batch_size
        self.cascade_wrapper.plan(  # ok: FC102
            [torch.tensor([0, n], dtype=torch.int32), self.decode_qo_indptr_cpu[: n + 1]],
            [self.prefix_kv_indptr_cpu, fb.kv_indptr_cpu[: n + 1]],
            [self.prefix_kv_indices, fb.kv_indices],
            [self.prefix_last_page_len_cpu, fb.kv_last_page_len_cpu[:n]],
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            q_data_type=cfg.dtype,
        )
        self._plan_info = (n, self.shared_prefix_pages)  # ok: FC103

    # ------------------------------------------------------------------ per step

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        super().init_forward_metadata(fb)
        self._prefix_ok = False
        if self.shared_prefix_pages == 0 or not fb.forward_mode.is_decode():
            return
        self._prefix_ok = bool((fb.prefix_lens >= self.shared_prefix_tokens).all())  # expect: FC101
        if self._prefix_ok:
            self._plan_cascade(fb)

    def init_forward_metadata_capture_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        super().init_forward_metadata_capture_cuda_graph(bs, fb)
        if self.shared_prefix_pages:
            self._prefix_ok = True
            self._plan_cascade(fb)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        if self.shared_prefix_pages:
            self._prefix_ok = True
            self._plan_cascade(fb)
        super().init_forward_metadata_replay_cuda_graph(bs, fb)
        if self.shared_prefix_pages:
            # The mirrors' indptr still counts the prompt pages level 0 covers; start
            # the graph decode at each request's first page after the prompt.
            self.graph_kv_indptr[1 : bs + 1].sub_(self.shared_prefix_pages)  # expect: FC104

    def forward_decode(self, q, k, v, layer, fb: ForwardBatch) -> torch.Tensor:
        if self.shared_prefix_pages and self._prefix_ok:
            return self.cascade_wrapper.run(q, self.kv_caches[layer.layer_id])  # expect: FC108
        return super().forward_decode(q, k, v, layer, fb)

    def forward_extend(self, q, k, v, layer, fb: ForwardBatch) -> torch.Tensor:
        """Prefill of requests that carry the shared prompt."""
        if self.shared_prefix_pages and fb.prefix_lens.min().item() < self.shared_prefix_tokens:  # ok: FC101
            raise RuntimeError("a request in a shared-prompt batch does not start with the prompt")
        self.prefix_lse = torch.empty(q.shape[0], self.cfg.num_qo_heads, dtype=torch.float32, device=self.device)  # ok: FC107
        return super().forward_extend(q, k, v, layer, fb)
