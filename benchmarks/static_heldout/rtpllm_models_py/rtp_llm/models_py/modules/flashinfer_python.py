"""FlashInfer attention ops of the Python model path: prefill and decode, eager and CUDA-graph."""

from dataclasses import dataclass
from typing import Dict, Optional

import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    MultiLevelCascadeAttentionWrapper,
)
from flashinfer.decode import trtllm_batch_decode_with_kv_cache
from flashinfer.prefill import trtllm_batch_context_with_kv_cache

from rtp_llm.models_py.modules.attn_inputs import AttentionInputs, PageTable
from rtp_llm.models_py.utils import get_trtllm_gen_workspace, get_zero_workspace, workspace_bytes_for

PREFILL_WORKSPACE_BYTES = 256 * 1024 * 1024


@dataclass
class PrefillParams:
    """What the prefill kernels read besides the wrapper's plan; rebuilt by every prepare()."""

    block_tables: torch.Tensor
    kv_lens: torch.Tensor
    cu_seqlens: torch.Tensor
    cu_kv_seqlens: torch.Tensor
    max_q: int
    max_kv: int


@dataclass
class DecodeParams:
    batch_size: int
    graph_bs: int
    q_len_per_req: int
    block_tables: torch.Tensor
    seq_lens: torch.Tensor

    @classmethod
    def build(
        cls, kv_lens_host: torch.Tensor, block_ids: torch.Tensor, *, q_len_per_req: int, graph_bs: int, device
    ) -> "DecodeParams":
        return cls(
            batch_size=kv_lens_host.size(0),
            graph_bs=graph_bs,
            q_len_per_req=q_len_per_req,
            block_tables=block_ids,
            seq_lens=kv_lens_host.to(device, non_blocking=True),
        )

    @classmethod
    def for_capture(cls, bs: int, *, q_len_per_req: int, max_blocks: int, device) -> "DecodeParams":
        return cls(
            batch_size=bs,
            graph_bs=bs,
            q_len_per_req=q_len_per_req,
            block_tables=torch.zeros(bs, max_blocks, dtype=torch.int32, device=device),
            seq_lens=torch.ones(bs, dtype=torch.int32, device=device),
        )


class FlashinferAttnOpBase:
    def __init__(self, config, *, device: torch.device):
        self.config = config
        self.device = device
        self.head_num = config.head_num // config.tp_size
        self.head_num_kv = max(config.head_num_kv // config.tp_size, 1)
        self.size_per_head = config.size_per_head
        self.scale = self.size_per_head**-0.5
        self.page_size = config.seq_size_per_block
        self.dtype = config.data_type
        self.max_batch_size = config.max_generate_batch_size
        self.max_blocks_per_seq = (config.max_seq_len + self.page_size - 1) // self.page_size
        self.max_pages = self.max_blocks_per_seq * self.max_batch_size
        # which kernel family serves this op ("fa2" wrappers or the "trtllm-gen" functions)
        self._backend = "fa2"
        self.last_plan_args: Optional[dict] = None

    def support(self, attn_inputs: AttentionInputs) -> bool:
        return True

    def remember_plan(self, **plan_args) -> None:
        # our own record of what the last plan() was given (the wrapper's internals change between releases)
        self.last_plan_args = dict(plan_args)

    def _page_table(self, kv_lens_host: torch.Tensor, block_ids_host: torch.Tensor, device) -> PageTable:
        """Pages of each sequence, taken from the host block ids; ``kv_lens_host`` counts every cached token."""
        bs = kv_lens_host.size(0)
        pages = (kv_lens_host + self.page_size - 1) // self.page_size
        indptr_host = torch.zeros(bs + 1, dtype=torch.int32, pin_memory=True)
        torch.cumsum(pages, 0, dtype=torch.int32, out=indptr_host[1:])
        num_pages = int(indptr_host[bs])  # ok: FC101
        in_use = torch.arange(block_ids_host.size(1)).unsqueeze(0) < pages.unsqueeze(1)
        flat_host = block_ids_host[:bs][in_use]  # ok: FC101
        last_page_len_host = (kv_lens_host - (pages - 1) * self.page_size).to(torch.int32)
        return PageTable(
            indptr_host, flat_host.to(device, non_blocking=True), last_page_len_host.pin_memory(), num_pages
        )


class PyFlashinferPrefillAttnOp(FlashinferAttnOpBase):
    def __init__(self, config, *, device: torch.device):
        super().__init__(config, device=device)
        self.workspace = torch.empty(PREFILL_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.workspace, "HND", backend="fa2")
        self.use_trtllm_context = bool(config.use_trtllm_gen_context)
        self.ctx_workspace = get_zero_workspace(
            device,
            workspace_bytes_for(
                max_batch_size=config.max_context_batch_size,
                max_seq_len=config.max_seq_len,
                head_num=self.head_num,
                page_size=self.page_size,
            ),
        )
        self.params: Optional[PrefillParams] = None

    def support(self, attn_inputs: AttentionInputs) -> bool:
        # the JIT module for an unusual head dim only exists once a plan compiled it
        return self.size_per_head in (64, 128, 256) or hasattr(self.prefill_wrapper, "_cached_module")  # expect: FC103

    def prepare(self, attn_inputs: AttentionInputs) -> None:
        bs = attn_inputs.batch_size
        kv_lens_host = attn_inputs.prefix_lengths_host[:bs] + attn_inputs.input_lengths_host[:bs]
        indptr_host, indices, last_page_len_host, num_pages = self._page_table(
            kv_lens_host, attn_inputs.block_ids_host, attn_inputs.device
        )
        max_q = attn_inputs.input_lengths_host.max().item()  # ok: FC101
        cu_kv_host = torch.zeros(bs + 1, dtype=torch.int32)
        torch.cumsum(kv_lens_host, 0, dtype=torch.int32, out=cu_kv_host[1:])
        self.params = PrefillParams(
            block_tables=attn_inputs.block_ids[:bs],
            kv_lens=kv_lens_host.to(self.device, non_blocking=True),
            cu_seqlens=attn_inputs.cu_seqlens,
            cu_kv_seqlens=cu_kv_host.to(self.device, non_blocking=True),
            max_q=int(max_q),
            max_kv=int(kv_lens_host.max()),
        )
        if self.use_trtllm_context:
            return
        self.prefill_wrapper.plan(  # expect: FC102
            attn_inputs.cu_seqlens,
            indptr_host,
            indices,
            last_page_len_host,
            self.head_num,
            self.head_num_kv,
            self.size_per_head,
            self.page_size,
            causal=True,
            q_data_type=self.dtype,
            kv_data_type=self.dtype,
        )
        self.remember_plan(num_pages=num_pages, max_q=int(max_q))

    def forward(self, q: torch.Tensor, kv_cache: torch.Tensor, layer_idx: int) -> torch.Tensor:
        params = self.params
        if self.use_trtllm_context:
            return trtllm_batch_context_with_kv_cache(
                query=q,
                kv_cache=kv_cache,
                workspace_buffer=self.ctx_workspace,
                block_tables=params.block_tables,
                seq_lens=params.kv_lens,
                max_q_len=params.max_q,
                max_kv_len=params.max_kv,
                bmm1_scale=self.scale,
                bmm2_scale=1.0,
                batch_size=params.block_tables.shape[0],
                cum_seq_lens_q=params.cu_seqlens,
                cum_seq_lens_kv=params.cu_kv_seqlens,
            )
        return self.prefill_wrapper.run(q, kv_cache)  # ok: FC108


class PyFlashinferDecodeAttnOp(FlashinferAttnOpBase):
    def __init__(self, config, *, device: torch.device):
        super().__init__(config, device=device)
        ws_bytes = workspace_bytes_for(
            max_batch_size=self.max_batch_size,
            max_seq_len=config.max_seq_len,
            head_num=self.head_num,
            page_size=self.page_size,
        )
        self.workspace = torch.zeros(ws_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        self.use_trtllm_gen = bool(config.use_trtllm_gen_decode)
        if self.use_trtllm_gen:
            self._backend = "trtllm-gen"
        self.trtllm_workspace = get_trtllm_gen_workspace(device, ws_bytes)
        use_tc = self.head_num // self.head_num_kv > 4
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.workspace, "HND", use_tensor_cores=use_tc)
        # MTP verification: q_len > 1 per request goes through a prefill-style wrapper
        self.verify_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.workspace, "HND")
        # a shared system prompt: level 0 is the common prefix, level 1 the per-request suffixes
        self.cascade_wrapper = MultiLevelCascadeAttentionWrapper(2, self.workspace, "HND")
        self.shared_prefix_len = 0
        self.shared_prefix_pages_host: Optional[torch.Tensor] = None
        # graph-bound page table, shared by every captured batch size
        self.page_indptr = torch.zeros(self.max_batch_size + 1, dtype=torch.int32, device=device)
        self.page_indices = torch.zeros(self.max_pages, dtype=torch.int32, device=device)
        self.last_page_len = torch.ones(self.max_batch_size, dtype=torch.int32, device=device)
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.captured_plan_info: Dict[int, object] = {}
        self.params: Optional[DecodeParams] = None

    def init_cuda_graph_wrapper(self, bs: int) -> BatchDecodeWithPagedKVCacheWrapper:
        self.last_page_len[:bs].fill_(1)  # ok: FC104
        wrapper = BatchDecodeWithPagedKVCacheWrapper(
            self.workspace,
            "HND",
            use_cuda_graph=True,
            paged_kv_indptr_buffer=self.page_indptr[: bs + 1],
            paged_kv_indices_buffer=self.page_indices,
            paged_kv_last_page_len_buffer=self.last_page_len[:bs],
            use_tensor_cores=self.head_num // self.head_num_kv > 4,
        )
        # one page per row, so that the capture runs against a valid plan
        wrapper.plan(  # ok: FC102
            torch.arange(bs + 1, dtype=torch.int32),
            self.page_indices[:bs],
            torch.ones(bs, dtype=torch.int32),
            self.head_num,
            self.head_num_kv,
            self.size_per_head,
            self.page_size,
            q_data_type=self.dtype,
            kv_data_type=self.dtype,
        )
        self.graph_wrappers[bs] = wrapper
        self.captured_plan_info[bs] = None
        return wrapper

    def prepare(self, attn_inputs: AttentionInputs) -> None:
        bs = attn_inputs.batch_size
        kv_lens_host = attn_inputs.sequence_lengths_host[:bs] + 1
        table = self._page_table(kv_lens_host, attn_inputs.block_ids_host, attn_inputs.device)
        q_len = int(attn_inputs.q_len_per_req)
        self.params = DecodeParams.build(
            kv_lens_host, attn_inputs.block_ids[:bs], q_len_per_req=q_len, graph_bs=0, device=self.device
        )
        if self.use_trtllm_gen:
            return
        if self.shared_prefix_len > 0:
            shared_pages = self.shared_prefix_pages_host
            self.cascade_wrapper.plan(  # ok: FC102
                [torch.tensor([0, bs], dtype=torch.int32), torch.arange(bs + 1, dtype=torch.int32)],
                [torch.tensor([0, shared_pages.numel()], dtype=torch.int32), table.indptr_host],
                [shared_pages.to(self.device, non_blocking=True), table.indices],
                [torch.tensor([self.page_size], dtype=torch.int32), table.last_page_len_host],
                self.head_num,
                self.head_num_kv,
                self.size_per_head,
                self.page_size,
            )
            return
        self.decode_wrapper.plan(  # ok: FC102
            table.indptr_host,
            table.indices,
            table.last_page_len_host,
            self.head_num,
            self.head_num_kv,
            self.size_per_head,
            self.page_size,
            q_data_type=self.dtype,
            kv_data_type=self.dtype,
        )

    def prepare_cuda_graph(self, attn_inputs: AttentionInputs) -> None:
        """Before a replay: refresh the bound page table for the padded batch, then plan its wrapper."""
        assert self.graph_wrappers, "capture() must run before prepare_cuda_graph()"  # ok: FC109
        bs = attn_inputs.batch_size
        graph_bs = min(b for b in self.graph_wrappers if b >= bs)
        wrapper = self.graph_wrappers[graph_bs]
        kv_lens_host = attn_inputs.sequence_lengths_host[:bs] + 1
        table = self._page_table(kv_lens_host, attn_inputs.block_ids_host, attn_inputs.device)
        if table.num_pages > self.page_indices.numel():
            self.page_indices = torch.zeros(table.num_pages, dtype=torch.int32, device=self.device)  # expect: FC107
        self.page_indices[: table.num_pages].copy_(table.indices, non_blocking=True)  # ok: FC104
        self.page_indptr[: bs + 1].copy_(table.indptr_host, non_blocking=True)
        self.page_indptr[bs + 1 : graph_bs + 1].fill_(table.num_pages)
        self.last_page_len[:bs].copy_(table.last_page_len_host, non_blocking=True)
        wrapper.plan(  # expect: FC102
            self.page_indptr[: graph_bs + 1],
            self.page_indices,
            self.last_page_len[:graph_bs],
            self.head_num,
            self.head_num_kv,
            self.size_per_head,
            self.page_size,
            q_data_type=self.dtype,
            kv_data_type=self.dtype,
        )
        # a graph is only valid for the split decision it was captured with
        plan_info = wrapper._plan_info  # expect: FC103
        if self.captured_plan_info[graph_bs] is None:
            self.captured_plan_info[graph_bs] = plan_info
        self.params = DecodeParams.build(
            kv_lens_host,
            attn_inputs.block_ids[:bs],
            q_len_per_req=int(attn_inputs.q_len_per_req),
            graph_bs=graph_bs,
            device=self.device,
        )

    def forward(self, q: torch.Tensor, kv_cache: torch.Tensor, layer_idx: int) -> torch.Tensor:
        params = self.params
        if self.use_trtllm_gen:
            return trtllm_batch_decode_with_kv_cache(
                query=q,
                kv_cache=kv_cache,
                workspace_buffer=self.trtllm_workspace,
                block_tables=params.block_tables,
                seq_lens=params.seq_lens,
                max_seq_len=int(params.seq_lens.max()),  # expect: FC101
                bmm1_scale=self.scale,
                bmm2_scale=1.0,
            )
        if params.q_len_per_req > 1:
            return self.verify_wrapper.run(q, kv_cache)  # expect: FC108
        if self.shared_prefix_len > 0:
            return self.cascade_wrapper.run(q, kv_cache)  # expect: FC108
        wrapper = self.graph_wrappers.get(params.graph_bs, self.decode_wrapper)
        return wrapper.run(q, kv_cache)  # ok: FC108
