"""FlashInfer attention: eager wrappers planned per step, graph-mode decode wrappers per batch size."""

import numpy as np
import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    trtllm_batch_decode_with_kv_cache,
)

from engine_rt.batch import ForwardBatch, StepMetadata
from shmirror.config import PREFILL_WORKSPACE_BYTES, EngineConfig
from shmirror.helpers.clamp import clamp_lens, clamp_lens_
from shmirror.helpers.indptr import cumsum_indptr, indptr_from_counts_into
from shmirror.helpers.pages import last_page_lens, max_pages, pages_per_seq
from shmirror.mirrors import MirrorBank


class HelperAttnBackend:
    def __init__(self, cfg: EngineConfig, mirror: MirrorBank, device):
        self.cfg = cfg
        self.mirror = mirror
        self.device = device
        self._backend = "fa2"
        self.float_workspace = torch.empty(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.window_workspace = torch.zeros(cfg.window_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC106
        self.prefill_workspace = torch.zeros(PREFILL_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.trtllm_workspace = torch.empty(cfg.trtllm_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105

        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.float_workspace, "NHD", backend=self._backend)
        self.window_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.window_workspace, "NHD")
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, "NHD")
        self.graph_wrappers = {}

        max_bs = cfg.max_batch_size
        self.kv_indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices_buf = torch.zeros(cfg.max_total_pages, dtype=torch.int32, device=device)
        self.kv_last_page_buf = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.forward_metadata = None

    # ------------------------------------------------------------------ set-up
    def init_graph_buffers(self):
        self.kv_last_page_buf.fill_(1)  # ok: FC104
        self.kv_indptr_buf.zero_()

    def _block_tables(self, bs: int):
        indptr = self.mirror.kv_indptr_cpu[: bs + 1].numpy()
        indices = self.mirror.kv_indices_cpu.numpy()
        table = np.zeros((bs, self.cfg.max_pages_per_seq), dtype=np.int32)
        for i in range(bs):
            row = indices[indptr[i] : indptr[i + 1]]
            table[i, : row.shape[0]] = row
        return torch.from_numpy(table).pin_memory().to(self.device, non_blocking=True)

    def _plan_window(self, lens_np: np.ndarray, kv_indices):
        c = self.cfg
        ps = c.page_size
        self.window_wrapper.plan(  # ok: FC102
            torch.from_numpy(cumsum_indptr(pages_per_seq(lens_np, ps))),
            kv_indices,
            torch.from_numpy(last_page_lens(lens_np, ps)),
            num_qo_heads=c.num_qo_heads,
            num_kv_heads=c.num_kv_heads,
            head_dim=c.head_dim,
            page_size=ps,
            window_left=c.window - 1,
        )

    # ------------------------------------------------------------------ per step (eager)
    def init_forward_metadata(self, fb: ForwardBatch):
        c = self.cfg
        ps = c.page_size
        bs = fb.seq_lens.shape[0]
        if not fb.is_decode:
            qo_indptr = cumsum_indptr(fb.extend_lens)
            self.prefill_wrapper.plan(  # expect: FC102
                qo_indptr,
                self.mirror.kv_indptr_cpu[: bs + 1],
                fb.kv_indices,
                self.mirror.kv_last_page_cpu[:bs],
                c.num_qo_heads,
                c.num_kv_heads,
                c.head_dim,
                ps,
                causal=True,
            )
            self.forward_metadata = None
            return

        lens_np = self.mirror.seq_lens_np[:bs]
        longest = int(lens_np.max())
        use_trtllm = c.use_trtllm_decode and longest >= c.long_context_threshold
        kv_indptr = cumsum_indptr(pages_per_seq(fb.seq_lens, ps))
        last_dev = last_page_lens(fb.seq_lens, ps)
        self.decode_wrapper.plan(  # expect: FC102
            kv_indptr,
            fb.kv_indices,
            last_dev,
            num_qo_heads=c.num_qo_heads,
            num_kv_heads=c.num_kv_heads,
            head_dim=c.head_dim,
            page_size=ps,
        )
        self._plan_window(lens_np, fb.kv_indices)
        self.forward_metadata = StepMetadata(
            kv_indptr=kv_indptr,
            kv_indices=fb.kv_indices,
            last_page_len=last_dev,
            seq_lens=fb.seq_lens,
            graph_bs=None,
            use_trtllm=use_trtllm,
            max_seq_len_host=longest,
            block_tables=self._block_tables(bs) if use_trtllm else None,
        )

    # ------------------------------------------------------------------ graphs
    def init_forward_metadata_capture_cuda_graph(self, bs: int, fb: ForwardBatch):
        c = self.cfg
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.float_workspace,
            "NHD",
            use_cuda_graph=True,
            paged_kv_indptr_buffer=self.kv_indptr_buf[: bs + 1],
            paged_kv_indices_buffer=self.kv_indices_buf,
            paged_kv_last_page_len_buffer=self.kv_last_page_buf[:bs],
        )
        self.graph_wrappers[bs] = w
        self.mirror.kv_indptr_cpu[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
        self.mirror.kv_last_page_cpu[:bs] = 1
        self._plan_window(np.ones(bs, dtype=np.int32), self.kv_indices_buf[:bs])
        w.plan(
            self.mirror.kv_indptr_cpu[: bs + 1],
            self.kv_indices_buf[:bs],
            self.mirror.kv_last_page_cpu[:bs],
            num_qo_heads=c.num_qo_heads,
            num_kv_heads=c.num_kv_heads,
            head_dim=c.head_dim,
            page_size=c.page_size,
        )
        self.forward_metadata = StepMetadata(
            kv_indptr=self.kv_indptr_buf[: bs + 1],
            kv_indices=self.kv_indices_buf,
            last_page_len=self.kv_last_page_buf[:bs],
            seq_lens=fb.seq_lens,
            graph_bs=bs,
        )

    def init_forward_metadata_replay_cuda_graph(self, bs: int, seq_lens, seq_lens_cpu, kv_indices):
        c = self.cfg
        ps = c.page_size
        if max_pages(seq_lens, ps) > c.max_pages_per_seq:
            raise RuntimeError("a sequence outgrew its page-table row")
        lens_np = seq_lens_cpu.numpy()
        pages_np = pages_per_seq(lens_np, ps)
        self.mirror.kv_indptr_cpu[: bs + 1] = torch.from_numpy(cumsum_indptr(pages_np))
        self.mirror.kv_last_page_cpu[:bs] = torch.from_numpy(last_page_lens(lens_np, ps))
        n = kv_indices.shape[0]
        self.kv_indices_buf[:n].copy_(kv_indices, non_blocking=True)
        indptr_from_counts_into(self.kv_indptr_buf[: bs + 1], pages_per_seq(seq_lens, ps))  # ok: FC104
        self.kv_last_page_buf[:bs].copy_(self.mirror.kv_last_page_cpu[:bs], non_blocking=True)
        self._plan_window(lens_np, self.kv_indices_buf)
        w = self.graph_wrappers[bs]
        w.plan(  # ok: FC102
            self.mirror.kv_indptr_cpu[: bs + 1],
            self.kv_indices_buf,
            self.mirror.kv_last_page_cpu[:bs],
            num_qo_heads=c.num_qo_heads,
            num_kv_heads=c.num_kv_heads,
            head_dim=c.head_dim,
            page_size=ps,
        )
        # keep the indptr monotone past bs so a larger bucket never reads a stale tail
        tail = int(self.mirror.kv_indptr_cpu[bs])
        self.kv_indptr_buf[bs + 1 :].fill_(tail)  # expect: FC104
        self.mirror.kv_indptr_cpu[bs + 1 :] = tail  # ok: FC104

    # ------------------------------------------------------------------ forward
    def begin_decode_forward(self):
        md = self.forward_metadata
        # a draft rollback can leave a zero-length last page; the kernels want 1..page_size
        clamp_lens_(md.last_page_len, 1, self.cfg.page_size)  # expect: FC104

    def forward_decode(self, q, kv_cache, layer_id: int):
        md = self.forward_metadata
        if layer_id % self.cfg.window_every == 1:
            return self.window_wrapper.run(q, kv_cache)  # expect: FC108
        if md.use_trtllm:
            return trtllm_batch_decode_with_kv_cache(
                q,
                kv_cache,
                self.trtllm_workspace,
                md.block_tables,
                clamp_lens(md.seq_lens, self.cfg.max_seq_len),
                md.max_seq_len_host,
            )
        w = self.decode_wrapper if md.graph_bs is None else self.graph_wrappers[md.graph_bs]
        return w.run(q, kv_cache)  # ok: FC108

    def forward_extend(self, q, kv_cache):
        return self.prefill_wrapper.run(q, kv_cache)
