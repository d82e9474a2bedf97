"""Builds the step's ForwardBatch, runs the hooked model (or a decode graph) and samples."""

from typing import Dict, List, Sequence, Tuple

import numpy as np
import torch

from hookmeta.attention.backend import HookedFlashInferBackend, PagedKVPool
from hookmeta.attention.hooks import ActivationProfiler, MetadataHooks
from hookmeta.config import EngineConfig
from hookmeta.forward_batch import ForwardBatch, ForwardMode
from hookmeta.graph_runner import DecodeGraphRunner
from hookmeta.model import HookedDecoder


class ModelRunner:
    def __init__(self, cfg: EngineConfig):
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self.kv_pool = PagedKVPool(cfg, self.device)
        self.attn_backend = HookedFlashInferBackend(cfg, self.kv_pool)
        self.model = HookedDecoder(cfg, self.attn_backend).to(device=self.device, dtype=cfg.dtype)
        self.hooks = MetadataHooks(cfg, self.attn_backend)
        self.hooks.install(self.model)
        self.next_ids_cpu = torch.zeros(cfg.max_batch_size, dtype=torch.int64, pin_memory=True)
        self.copy_done = torch.cuda.Event()
        self.seq_lens_pinned = torch.zeros(cfg.max_batch_size, dtype=torch.int32, pin_memory=True)
        self.graph_runner = DecodeGraphRunner(self) if cfg.enable_cuda_graph else None

    # ------------------------------------------------------------------ start-up

    def warmup_prefill_kernels(self) -> None:
        """JIT-compile the prefill kernels once, before the scheduler starts."""
        c = self.cfg
        wrapper = self.attn_backend.prefill_wrapper
        qo_indptr = torch.tensor([0, c.page_size], dtype=torch.int32)
        kv_indptr = torch.tensor([0, 1], dtype=torch.int32)
        last_page_len = torch.tensor([c.page_size], dtype=torch.int32)
        kv_indices = torch.zeros(1, dtype=torch.int32, device=self.device)
        wrapper.plan(  # ok: FC102
            qo_indptr, kv_indptr, kv_indices, last_page_len,
            c.num_qo_heads, c.num_kv_heads, c.head_dim, c.page_size, causal=True, q_data_type=c.dtype,
        )
        q = torch.randn(c.page_size, c.num_qo_heads, c.head_dim, dtype=c.dtype, device=self.device)
        wrapper.run(q, self.kv_pool.layer(0))  # ok: FC108
        torch.cuda.synchronize()

    def profile_activations(self, prompt_ids: Sequence[int]) -> Dict[str, float]:
        batch = self.prepare_batch([list(prompt_ids)], [len(prompt_ids)], [list(range(len(prompt_ids)))], ForwardMode.EXTEND)
        with ActivationProfiler() as prof:
            self.model(batch.input_ids, forward_batch=batch)
        return prof.absmax

    def capture_graphs(self) -> None:
        if self.graph_runner is not None:
            self.graph_runner.capture()

    def memory_report(self) -> Dict[str, int]:
        be = self.attn_backend
        return {
            "kv_pool": self.kv_pool.nbytes(),
            "decode_workspace": be.workspace.numel(),
            "prefill_int_workspace": be.prefill_wrapper._int_workspace_buffer.numel(),  # expect: FC103
        }

    def shutdown(self) -> None:
        self.hooks.remove()

    # ------------------------------------------------------------------ per step

    def prepare_batch(
        self,
        token_ids: List[List[int]],
        seq_lens: List[int],
        page_ids: List[List[int]],
        mode: ForwardMode,
    ) -> ForwardBatch:
        c = self.cfg
        n = len(seq_lens)
        seq_lens_np = np.asarray(seq_lens, dtype=np.int32)
        ext_lens_np = np.asarray([len(t) for t in token_ids], dtype=np.int32)
        pages_np = (seq_lens_np + c.page_size - 1) // c.page_size
        kv_indptr_np = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(pages_np, out=kv_indptr_np[1:])
        qo_indptr_np = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(ext_lens_np, out=qo_indptr_np[1:])
        kv_indices_np = np.concatenate([np.asarray(p[:k], dtype=np.int32) for p, k in zip(page_ids, pages_np)])
        last_page_np = seq_lens_np - (pages_np - 1) * c.page_size
        positions_np = np.concatenate([np.arange(s - e, s) for s, e in zip(seq_lens_np, ext_lens_np)])
        slots_np = np.concatenate(
            [np.asarray(p, dtype=np.int64)[pos // c.page_size] * c.page_size + pos % c.page_size
             for p, pos in zip(page_ids, np.split(positions_np, qo_indptr_np[1:-1]))]
        )
        block_np = np.zeros((n, c.max_pages_per_req), dtype=np.int32)
        for i, (p, k) in enumerate(zip(page_ids, pages_np)):
            block_np[i, :k] = p[:k]
        num_pages = int(kv_indptr_np[-1])  # ok: FC101
        if n > self.seq_lens_pinned.numel():
            self.seq_lens_pinned = torch.empty(n, dtype=torch.int32, pin_memory=True)  # ok: FC107
        self.seq_lens_pinned[:n].numpy()[:] = seq_lens_np

        def to_dev(a: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(a).pin_memory().to(self.device, non_blocking=True)

        return ForwardBatch(
            forward_mode=mode,
            batch_size=n,
            num_pages=num_pages,
            input_ids=to_dev(np.concatenate([np.asarray(t, dtype=np.int64) for t in token_ids])),
            positions=to_dev(positions_np.astype(np.int64)),
            out_cache_loc=to_dev(slots_np),
            seq_lens=self.seq_lens_pinned[:n].to(self.device, non_blocking=True),
            qo_indptr=to_dev(qo_indptr_np),
            kv_indices=to_dev(kv_indices_np),
            kv_last_page_len=to_dev(last_page_np),
            block_tables=to_dev(block_np),
            seq_lens_cpu=self.seq_lens_pinned[:n],
            qo_indptr_cpu=torch.from_numpy(qo_indptr_np),
            kv_indptr_cpu=torch.from_numpy(kv_indptr_np),
            kv_last_page_len_cpu=torch.from_numpy(last_page_np),
            raw_decode=mode is ForwardMode.DECODE and c.decode_kernel == "trtllm-raw",
        )

    def execute_step(
        self,
        token_ids: List[List[int]],
        seq_lens: List[int],
        page_ids: List[List[int]],
        mode: ForwardMode,
    ) -> Tuple[torch.Tensor, torch.cuda.Event]:
        batch = self.prepare_batch(token_ids, seq_lens, page_ids, mode)
        if self.graph_runner is not None and self.graph_runner.can_run(batch):
            logits = self.graph_runner.replay(batch)
        else:
            # the decoder's pre-hooks plan attention for this batch before any layer runs
            logits = self.model(batch.input_ids, forward_batch=batch)
        next_ids = torch.argmax(logits, dim=-1)
        self.next_ids_cpu[: batch.batch_size].copy_(next_ids, non_blocking=True)
        self.copy_done.record()
        return self.next_ids_cpu, self.copy_done
