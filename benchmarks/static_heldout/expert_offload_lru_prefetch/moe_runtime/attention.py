import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from moeoffload.config import OffloadConfig
from moeoffload.workspaces import prefill_workspace, trtllm_long_workspace


class OffloadAttention:
    """FlashInfer paged attention beside the offloaded MoE: per-bucket decode graphs, eager overflow and window
    decode, paged prefill, trtllm-gen decode for very long contexts."""

    def __init__(self, cfg: OffloadConfig, kv_cache, device):
        self.cfg = cfg
        self.kv_cache = kv_cache  # [layers, pages, 2, page_size, kv_heads, head_dim]
        self.device = device
        self.float_ws = torch.empty(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.window_workspace = torch.zeros(cfg.max_batch * cfg.num_qo_heads * cfg.head_dim * 64, dtype=torch.uint8, device=device)  # ok: FC106
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(prefill_workspace(device), "NHD")
        self.overflow_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.float_ws, "NHD", backend="fa2")
        self.window_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.window_workspace, "NHD", backend="fa2")
        self.trtllm_ws = trtllm_long_workspace(cfg.trtllm_workspace_bytes(), str(device))
        self.graph_wrappers = {}
        self.kv_indptr = None
        self.kv_indices = None
        self.kv_last_page_len = None
        max_bs = cfg.max_batch
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.win_indptr_gpu = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.win_last_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.sm_scale = cfg.head_dim**-0.5

    # ---- set-up -------------------------------------------------------------------------------------------

    def jit_ready(self):
        """True once the prefill kernels were compiled, so warm-up can skip the dummy prefill."""
        return hasattr(self.prefill_wrapper, "_cached_module")  # expect: FC103

    def init_cuda_graph_state(self, max_bs):
        if self.kv_indptr is None:
            self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
            self.kv_indices = torch.zeros(self.cfg.max_pages, dtype=torch.int32, device=self.device)
            self.kv_last_page_len = torch.empty(max_bs, dtype=torch.int32, device=self.device)
        self.kv_last_page_len.fill_(1)  # ok: FC104

    def init_forward_metadata_capture_cuda_graph(self, bs):
        self.kv_indptr[: bs + 1] = torch.arange(0, bs + 1, dtype=torch.int32, device=self.device)  # ok: FC104
        wrapper = BatchDecodeWithPagedKVCacheWrapper(
            self.float_ws,
            "NHD",
            use_cuda_graph=True,
            backend="fa2",
            paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.kv_indices,
            paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
        )
        self.graph_wrappers[bs] = wrapper
        self.kv_indptr_cpu[: bs + 1] = torch.arange(0, bs + 1, dtype=torch.int32)
        self.last_page_cpu[:bs] = 1
        self._plan_bucket(bs)

    # ---- per step -----------------------------------------------------------------------------------------

    def init_forward_metadata_replay_cuda_graph(self, bs, bucket, seq_lens_np, kv_indices_np):
        page = self.cfg.page_size
        lens = seq_lens_np[:bs]
        pages = (lens + page - 1) // page
        self.kv_indptr_cpu[0] = 0
        self.kv_indptr_cpu[1 : bs + 1] = torch.from_numpy(np.cumsum(pages).astype(np.int32))
        self.kv_indptr_cpu[bs + 1 : bucket + 1] = self.kv_indptr_cpu[bs]
        self.last_page_cpu[:bs] = torch.from_numpy(((lens - 1) % page + 1).astype(np.int32))
        self.last_page_cpu[bs:bucket] = 1
        total = int(self.kv_indptr_cpu[bs])  # ok: FC101
        self.kv_indices[:total].copy_(torch.from_numpy(kv_indices_np[:total]), non_blocking=True)  # ok: FC104
        self._plan_bucket(bucket)
        # padded rows point past `total`: scrub them so they never read a page an expert load recycled
        self.kv_indices[total : total + bucket].zero_()  # expect: FC104

    def _plan_bucket(self, bucket):
        cfg = self.cfg
        wrapper = self.graph_wrappers[bucket]
        wrapper.plan(  # ok: FC102
            self.kv_indptr_cpu[: bucket + 1],
            self.kv_indices,
            self.last_page_cpu[:bucket],
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            data_type=torch.bfloat16,
        )

    def init_forward_metadata(self, fb):
        cfg = self.cfg
        if not fb.is_decode:
            self.prefill_wrapper.plan(  # ok: FC102
                fb.qo_indptr_cpu,
                fb.kv_indptr_cpu,
                fb.kv_indices,
                fb.last_page_len_cpu,
                cfg.num_qo_heads,
                cfg.num_kv_heads,
                cfg.head_dim,
                cfg.page_size,
                causal=True,
            )
            return
        if fb.use_graph:
            return  # the graph runner plans the bucket's wrapper on replay
        if fb.max_kv_len <= cfg.long_context_threshold:
            self.overflow_wrapper.plan(  # expect: FC102
                **dict(
                    indptr=fb.kv_indptr_cpu,
                    indices=fb.kv_indices,
                    last_page_len=fb.last_page_len,
                    num_qo_heads=cfg.num_qo_heads,
                    num_kv_heads=cfg.num_kv_heads,
                    head_dim=cfg.head_dim,
                    page_size=cfg.page_size,
                )
            )
        if fb.window_layers:
            n = fb.bs + 1
            self.win_indptr_gpu[:n].copy_(torch.from_numpy(fb.window_indptr_np), non_blocking=True)
            self.window_wrapper.plan(  # expect: FC102
                self.win_indptr_gpu[:n],
                fb.window_indices,
                self.win_last_cpu[: fb.bs],
                cfg.num_qo_heads,
                cfg.num_kv_heads,
                cfg.head_dim,
                cfg.page_size,
            )

    # ---- attention ----------------------------------------------------------------------------------------

    def forward_decode(self, q, layer_id, fb):
        kv = self.kv_cache[layer_id]
        if layer_id in fb.window_layers:
            return self.window_wrapper.run(q, kv)  # expect: FC108
        if fb.max_kv_len > self.cfg.long_context_threshold and not fb.use_graph:
            return trtllm_batch_decode_with_kv_cache(
                query=q,
                kv_cache=kv,
                workspace_buffer=self.trtllm_ws,
                block_tables=fb.block_tables,
                seq_lens=fb.seq_lens_dev,
                max_seq_len=self.cfg.max_seq_len,
                bmm1_scale=self.sm_scale,
                bmm2_scale=1.0,
            )
        wrapper = self.graph_wrappers[fb.bucket] if fb.use_graph else self.overflow_wrapper
        return wrapper.run(q, kv)  # ok: FC108

    def forward_extend(self, q, layer_id, fb):
        return self.prefill_wrapper.run(q, self.kv_cache[layer_id])
