import functools
import math

import numpy as np
import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    MultiLevelCascadeAttentionWrapper,
)
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from radix_srv.forward_batch import DecodeMetadata, ForwardMode
from radixkv.workspace import decode_workspace, extend_workspace


class RadixFlashInferBackend:
    """Attention metadata planned from the radix tree's matches: an eager decode wrapper, a two-level cascade when
    the whole batch shares a tree prefix, a trtllm-gen prefill over the matched pages, decode graphs per size."""

    def __init__(self, model_runner):
        args = model_runner.server_args
        self.device = model_runner.device
        self.kv_cache = model_runner.kv_cache
        self.page_size = args.page_size
        self.num_qo_heads = args.num_qo_heads
        self.num_kv_heads = args.num_kv_heads
        self.head_dim = args.head_dim
        self.max_bs = args.max_running_requests
        self.long_decode_pages = args.long_decode_pages
        shared_ws = decode_workspace(self.device)
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(shared_ws, "NHD")
        self.cascade = MultiLevelCascadeAttentionWrapper(2, shared_ws, "NHD")
        self.extend_wrapper = BatchPrefillWithPagedKVCacheWrapper(
            extend_workspace(args.chunked_prefill_size * args.num_qo_heads * 1024, self.device),
            "NHD",
            backend="trtllm-gen",
        )
        trt_ws = torch.empty(args.max_running_requests * args.num_qo_heads * 8192, dtype=torch.uint8, device=self.device)  # ok: FC105
        trt_ws.fill_(0)
        self.trtllm_workspace = trt_ws
        self.graph_workspace = torch.empty(args.max_running_requests * args.num_qo_heads * args.head_dim * 256, dtype=torch.uint8, device=self.device)  # ok: FC106
        self.graph_wrappers = {}
        self.capture_max_len = {}
        self.forward_metadata = DecodeMetadata()
        self.cow_scratch = None
        self.shared_extend_rows = []
        self.kv_indptr = torch.zeros(self.max_bs + 1, dtype=torch.int32, device=self.device)
        self.kv_indices = torch.zeros(args.max_total_pages, dtype=torch.int32, device=self.device)
        self.kv_last_page_len = torch.ones(self.max_bs, dtype=torch.int32, device=self.device)
        self.kv_indptr_cpu = torch.zeros(self.max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_cpu = torch.ones(self.max_bs, dtype=torch.int32, pin_memory=True)

    # ---- eager steps ---------------------------------------------------------------------------------------

    def init_forward_metadata(self, fb):
        bs = fb.batch_size
        page = self.page_size
        max_pages = math.ceil(int(fb.seq_lens_cpu.max()) / page)  # ok: FC101
        if fb.forward_mode == ForwardMode.DECODE:
            if fb.shared_prefix_pages:
                self._plan_cascade(fb)
                self.forward_metadata = DecodeMetadata(cascade=True)
                return
            self.decode_wrapper.plan(  # ok: FC102
                fb.kv_indptr_cpu,
                fb.kv_indices,
                fb.last_page_cpu,
                self.num_qo_heads,
                self.num_kv_heads,
                self.head_dim,
                page,
            )
            self.forward_metadata = DecodeMetadata(use_trtllm=max_pages > self.long_decode_pages, max_seq_len=max_pages * page)
            return

        # extend: a request resumed after a chunked prefill ends its cached part mid-page; that partial page is
        # shared with the tree and must be copied before new tokens land in it
        cow_rows = fb.block_tables[fb.prefix_lens % page != 0]  # expect: FC101
        shared_rows = [i for i in range(bs) if fb.prefix_lens_cpu[i] >= fb.shared_prefix_pages * page]  # ok: FC101
        scratch = self.cow_scratch
        if scratch is None:
            self.cow_scratch = torch.empty((self.max_bs, 2, page, self.num_kv_heads, self.head_dim), dtype=torch.bfloat16, device=self.device)  # ok: FC107
        self._copy_on_write(cow_rows)
        qo_indptr_cpu = torch.from_numpy(np.concatenate([[0], np.cumsum(fb.extend_lens_cpu)]).astype(np.int32))
        kv_pages = (fb.seq_lens + page - 1) // page
        kv_indptr_dev = torch.zeros(bs + 1, dtype=torch.int32, device=self.device)
        torch.cumsum(kv_pages, 0, dtype=torch.int32, out=kv_indptr_dev[1:])
        plan = functools.partial(self.extend_wrapper.plan, causal=True)
        plan(  # expect: FC102
            qo_indptr_cpu,
            kv_indptr_dev,
            fb.kv_indices,
            fb.last_page_cpu,
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            page,
        )
        self.shared_extend_rows = shared_rows
        self.forward_metadata = DecodeMetadata()

    def _plan_cascade(self, fb):
        bs = fb.batch_size
        page = self.page_size
        shared = fb.shared_prefix_pages
        lens_np = fb.seq_lens_cpu.numpy()
        own_pages_np = (lens_np + page - 1) // page - shared
        unique_indptr_np = np.zeros(bs + 1, dtype=np.int32)
        np.cumsum(own_pages_np, out=unique_indptr_np[1:])
        starts_np = fb.kv_indptr_cpu.numpy()[:-1]
        unique_idx_np = np.concatenate([fb.kv_indices_np[s + shared : s + shared + n] for s, n in zip(starts_np, own_pages_np)])
        self.cascade.plan(
            [torch.tensor([0, bs], dtype=torch.int32), torch.arange(bs + 1, dtype=torch.int32)],
            [torch.tensor([0, shared], dtype=torch.int32), torch.from_numpy(unique_indptr_np)],
            [fb.kv_indices[:shared], torch.from_numpy(unique_idx_np).to(self.device, non_blocking=True)],
            [torch.tensor([page], dtype=torch.int32), fb.last_page_cpu],
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            page,
        )

    def _copy_on_write(self, rows):
        if rows.numel() == 0:
            return
        src = rows[:, -1]
        self.cow_scratch[: rows.shape[0]].copy_(self.kv_cache[0][src])

    # ---- graphs --------------------------------------------------------------------------------------------

    def init_forward_metadata_capture_cuda_graph(self, bs, max_len):
        self.kv_indptr[: bs + 1].copy_(torch.arange(bs + 1, dtype=torch.int32))  # ok: FC104
        wrapper = BatchDecodeWithPagedKVCacheWrapper(
            self.graph_workspace,
            "NHD",
            use_cuda_graph=True,
            backend="fa2",
            paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.kv_indices,
            paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
        )
        self.graph_wrappers[bs] = wrapper
        self.capture_max_len[bs] = max_len
        self.kv_indptr_cpu[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
        self.last_page_cpu[:bs] = 1
        wrapper.plan(
            self.kv_indptr_cpu[: bs + 1],
            self.kv_indices,
            self.last_page_cpu[:bs],
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            self.page_size,
        )
        self.forward_metadata = DecodeMetadata(graph_bs=bs)

    def init_forward_metadata_replay_cuda_graph(self, bucket, bs, seq_lens_cpu, kv_indices_np):
        page = self.page_size
        lens = seq_lens_cpu[:bs].tolist()  # ok: FC101
        pages = [(n + page - 1) // page for n in lens]
        indptr = np.zeros(bucket + 1, dtype=np.int32)
        np.cumsum(pages, out=indptr[1 : bs + 1])
        indptr[bs + 1 :] = indptr[bs]
        self.kv_indptr_cpu[: bucket + 1] = torch.from_numpy(indptr)
        self.last_page_cpu[:bs] = torch.tensor([(n - 1) % page + 1 for n in lens], dtype=torch.int32)
        self.last_page_cpu[bs:bucket] = 1
        total = int(indptr[bs])
        if total > self.kv_indices.numel():
            self.kv_indices = self.kv_indices.new_zeros(2 * total)  # expect: FC107
        self.kv_indices[:total].copy_(torch.from_numpy(kv_indices_np[:total]), non_blocking=True)  # ok: FC104
        self.graph_wrappers[bucket].plan(  # ok: FC102
            self.kv_indptr_cpu[: bucket + 1],
            self.kv_indices,
            self.last_page_cpu[:bucket],
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            page,
        )
        self.forward_metadata = DecodeMetadata(graph_bs=bucket)

    # ---- attention -----------------------------------------------------------------------------------------

    def forward_decode(self, q, layer_id, block_tables, seq_lens):
        kv = self.kv_cache[layer_id]
        md = self.forward_metadata
        if md.cascade:
            return self.cascade.run(q, kv)  # expect: FC108
        if md.use_trtllm:
            return trtllm_batch_decode_with_kv_cache(
                query=q,
                kv_cache=kv,
                workspace_buffer=self.trtllm_workspace,
                block_tables=block_tables,
                seq_lens=seq_lens,
                max_seq_len=md.max_seq_len,
                bmm1_scale=self.head_dim**-0.5,
                bmm2_scale=1.0,
            )
        if md.graph_bs:
            w = self.graph_wrappers[md.graph_bs]
        else:
            w = self.decode_wrapper
        return w.run(q, kv)  # ok: FC108

    def forward_extend(self, q, layer_id):
        return self.extend_wrapper.run(q, self.kv_cache[layer_id])
