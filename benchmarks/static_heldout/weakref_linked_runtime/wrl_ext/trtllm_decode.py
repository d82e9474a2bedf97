"""trtllm-gen decode and context kernels (Blackwell), attached to the FlashInfer backend when
``decode_backend == "trtllm-gen"``.

The kernels take the engine's block table directly; the workspaces come from the runtime's
``WorkspaceArena``, reached through a weak reference.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

import torch
from flashinfer.decode import trtllm_batch_decode_with_kv_cache
from flashinfer.prefill import trtllm_batch_context_with_kv_cache

from wrl.batch import ForwardBatch
from wrl.config import workspace_bytes_for

if TYPE_CHECKING:
    from wrl.model_runner import ModelRunner


class TrtllmGenDecode:
    def __init__(self, runner: "ModelRunner"):
        self.cfg = runner.cfg
        self._runner_ref = weakref.ref(runner)
        self._arena_ref = weakref.ref(runner.resources.arena)
        self.bmm1_scale = self.cfg.head_dim**-0.5
        nbytes = workspace_bytes_for(self.cfg)
        # the context kernel's own workspace, zeroed once: it keeps split-k counters too
        self.context_workspace = torch.empty(nbytes, dtype=torch.uint8, device=runner.device)  # ok: FC105
        self.context_workspace.zero_()

    def _block_tables(self, fb: ForwardBatch) -> torch.Tensor:
        runner = self._runner_ref()
        return runner.kv_pool.req_to_page[fb.req_pool_indices.long()]

    def decode(self, q: torch.Tensor, kv_cache: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        arena = self._arena_ref()
        return trtllm_batch_decode_with_kv_cache(
            q,
            kv_cache,
            arena.trtllm_workspace,
            self._block_tables(fb),
            fb.seq_lens,
            max_seq_len=self.cfg.max_context_len,
            bmm1_scale=self.bmm1_scale,
            bmm2_scale=1.0,
        )

    def context(self, q: torch.Tensor, kv_cache: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        runner = self._runner_ref()
        ib = runner.input_buffers
        bs = fb.batch_size
        return trtllm_batch_context_with_kv_cache(
            q,
            kv_cache,
            self.context_workspace,
            self._block_tables(fb),
            fb.seq_lens,
            fb.max_extend_len,
            self.cfg.max_context_len,
            self.bmm1_scale,
            1.0,
            bs,
            ib.qo_indptr[: bs + 1],
            ib.cu_seq_lens_kv[: bs + 1],
        )
