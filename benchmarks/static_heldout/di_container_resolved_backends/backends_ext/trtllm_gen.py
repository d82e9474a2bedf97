"""trtllm-gen decode for Blackwell; bound instead of FlashInferBackend when config.attention_backend == "trtllm"."""
from typing import Dict
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache
from diengine.batch import ForwardBatch
from diengine.config import EngineConfig, default_prefill_ws_bytes
from diengine.interfaces import AttentionBackend, KVPool, WorkspaceProvider

_JIT_MODULE_ATTR = "_cached_module"


class TrtllmGenBackend(AttentionBackend):
    def __init__(self, config: EngineConfig, workspaces: WorkspaceProvider, pool: KVPool):
        self.cfg, self.device, self.pool = config, torch.device(config.device), pool
        self.max_pages = config.max_context // config.page_size
        self.heads = (config.num_qo_heads, config.num_kv_heads, config.head_dim, config.page_size)
        self.wrapper = BatchDecodeWithPagedKVCacheWrapper(workspaces.zeroed_workspace(), "HND", backend="trtllm-gen")
        self.mtp_workspace = torch.empty(config.max_bs * config.num_qo_heads * 4096, dtype=torch.uint8, device=self.device)  # expect: FC105
        self.mtp_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.mtp_workspace, "HND", backend="trtllm-gen")
        self.xqa_workspace = torch.empty(config.max_num_tokens * config.num_qo_heads * 64, dtype=torch.uint8, device=self.device)  # expect: FC105
        self.prefill_workspace = torch.empty(default_prefill_ws_bytes(), dtype=torch.uint8, device=self.device)  # expect: FC106
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, "HND", backend="fa2")
        self.block_tables = torch.zeros(config.max_bs, self.max_pages, dtype=torch.int32, device=self.device)
        self.seq_lens_dev = torch.zeros(config.max_bs, dtype=torch.int32, device=self.device)
        self.seq_lens_host = torch.zeros(config.max_bs, dtype=torch.int32, pin_memory=True)
        self.graph_indptr = torch.zeros(config.max_bs + 1, dtype=torch.int32, device=self.device)
        self.graph_last_page_len = torch.ones(config.max_bs, dtype=torch.int32, device=self.device)
        self.graph_decode: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.use_direct_kernel = config.page_size in (16, 32)
        self.max_seq_len = config.max_context

    def init_cuda_graph_state(self, max_bs: int) -> None:
        ws = torch.empty(max_bs * self.cfg.num_qo_heads * 4096, dtype=torch.uint8, device=self.device)  # ok: FC105
        ws.zero_()
        self.graph_workspace = ws
        if not hasattr(self.wrapper, _JIT_MODULE_ATTR):  # expect: FC103
            raise RuntimeError("trtllm-gen module was not compiled at start-up")

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        bs = fb.batch_size
        self.seq_lens_host[:bs].copy_(fb.seq_lens)  # expect: FC101
        live_rows = fb.req_pool_indices[fb.req_pool_indices >= 0]  # expect: FC101
        self.max_seq_len = int(fb.seq_lens.max())  # expect: FC101
        if self.block_tables.shape[0] < bs:
            self.block_tables.resize_(bs, self.max_pages)  # expect: FC107
        self.block_tables[: live_rows.shape[0]].copy_(fb.kv_indices[: bs * self.max_pages].view(bs, -1))  # ok: FC104
        self.seq_lens_dev[:bs].copy_(fb.seq_lens, non_blocking=True)
        kv_indptr = fb.kv_indptr_cpu.to(self.device, non_blocking=True)
        self.wrapper.plan(kv_indptr, fb.kv_indices, fb.kv_last_page_len_cpu, *self.heads)  # expect: FC102
        self.mtp_wrapper.plan(fb.kv_indptr_cpu, fb.kv_indices, fb.kv_last_page_len, *self.heads)  # expect: FC102
        if not fb.is_decode:
            self.prefill_wrapper.plan(fb.qo_indptr_cpu, fb.kv_indptr_cpu, fb.kv_indices, fb.kv_last_page_len_cpu, *self.heads)  # ok: FC102

    def init_forward_metadata_capture_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.graph_workspace, "HND", use_cuda_graph=True, backend="trtllm-gen",
            paged_kv_indptr_buffer=self.graph_indptr[: bs + 1],
            paged_kv_indices_buffer=self.block_tables.view(-1),
            paged_kv_last_page_len_buffer=self.graph_last_page_len[:bs],
        )
        w.plan(fb.kv_indptr_cpu[: bs + 1], fb.kv_indices, fb.kv_last_page_len_cpu[:bs], *self.heads)  # ok: FC102
        self.graph_decode[bs] = w

    def init_forward_metadata_replay_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        setattr(self, "seq_lens_dev", fb.seq_lens.clone())  # expect: FC107
        self.graph_indptr[: fb.batch_size + 1].copy_(fb.kv_indptr[: fb.batch_size + 1], non_blocking=True)  # ok: FC104
        self.graph_decode[bs].plan(fb.kv_indptr_cpu, fb.kv_indices, fb.kv_last_page_len_cpu, *self.heads)  # ok: FC102

    def forward_decode(self, q, layer, fb: ForwardBatch):
        bs = fb.batch_size
        kv = self.pool.kv_cache(layer.layer_id)
        if bs in self.graph_decode:
            return self.graph_decode[bs].run(q, kv)  # ok: FC108
        if self.use_direct_kernel:
            return trtllm_batch_decode_with_kv_cache(q, kv, self.xqa_workspace, self.block_tables[:bs],
                                                     self.seq_lens_dev[:bs], self.max_seq_len)
        return self.wrapper.run(q, kv)  # expect: FC108

    def forward_extend(self, q, k, v, layer, fb: ForwardBatch):
        kv = self.pool.kv_cache(layer.layer_id)
        kv[fb.out_cache_loc] = torch.stack((k, v), dim=1)
        return self.prefill_wrapper.run(q, kv)
