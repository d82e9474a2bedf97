"""Shared system-prompt decode: a two-level cascade over the prompt's pages (level 0, shared by
every request) and each request's own pages (level 1).

Installed by ``ModelRunner.enable_prefix_sharing``; the backend holds it through a
``weakref.ref`` so that dropping the plugin (prompt changed) detaches it.
"""

from __future__ import annotations

import os
import weakref
from typing import TYPE_CHECKING

import torch
from flashinfer import MultiLevelCascadeAttentionWrapper

if TYPE_CHECKING:
    from wrl.model_runner import ModelRunner


class SharedPrefixDecode:
    def __init__(self, runner: "ModelRunner", prefix_pages: torch.Tensor, prefix_len: int):
        cfg = runner.cfg
        self.cfg = cfg
        self._runner_ref = weakref.ref(runner)
        ws_bytes = int(os.environ.get("WRL_PREFIX_WS_BYTES", 64 << 20))
        self.workspace = torch.zeros(ws_bytes, dtype=torch.uint8, device=runner.device)  # expect: FC106
        self.cascade = MultiLevelCascadeAttentionWrapper(2, self.workspace, "NHD")
        self.prefix_pages = prefix_pages  # device page ids of the shared prompt
        num_prefix_pages = int(prefix_pages.shape[0])
        self.prefix_kv_indptr_cpu = torch.tensor([0, num_prefix_pages], dtype=torch.int32)
        self.prefix_last_page_len_cpu = torch.tensor([(prefix_len - 1) % cfg.page_size + 1], dtype=torch.int32)
        self.prefix_qo_indptr_cpu = torch.zeros(2, dtype=torch.int32)

    def plan_step(self, bs: int) -> None:
        runner = self._runner_ref()
        if runner is None:
            return
        ib = runner.input_buffers
        cfg = self.cfg
        # every query of the batch attends to the one shared prefix
        self.prefix_qo_indptr_cpu[1] = bs
        self.cascade.plan(  # expect: FC102
            [self.prefix_qo_indptr_cpu, ib.qo_indptr_cpu[: bs + 1]],
            [self.prefix_kv_indptr_cpu, ib.kv_indptr_cpu[: bs + 1]],
            [self.prefix_pages, ib.kv_indices],
            [self.prefix_last_page_len_cpu, ib.kv_last_page_len[:bs]],
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
        )

    def attend(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.cascade.run(q, kv_cache)  # expect: FC108
