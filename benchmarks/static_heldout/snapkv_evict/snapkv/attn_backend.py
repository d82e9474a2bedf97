"""FlashInfer decode over the compacted page lists, eager and per graph bucket."""

from dataclasses import dataclass
from typing import Dict, List, Optional

import torch
import triton
import triton.language as tl
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from snapkv.config import SnapConfig
from snapkv.page_table import PageTable

PREFILL_WS_BYTES = 256 * 1024 * 1024


@triton.jit
def _pack_pages_kernel(req_to_page, rows, kv_indptr, kv_indices, row_stride, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    row = tl.load(rows + pid)
    start = tl.load(kv_indptr + pid)
    end = tl.load(kv_indptr + pid + 1)
    n = end - start
    for off in range(0, n, BLOCK):
        idx = off + tl.arange(0, BLOCK)
        mask = idx < n
        page = tl.load(req_to_page + row * row_stride + idx, mask=mask)
        tl.store(kv_indices + start + idx, page, mask=mask)


@dataclass
class DecodePlanInputs:
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len: torch.Tensor
    bs: int


@dataclass
class PrefillBatch:
    bs: int
    qo_indptr_list: List[int]
    rows_cpu: torch.Tensor
    rows_gpu: torch.Tensor


class SnapDecodeBackend:
    def __init__(self, cfg: SnapConfig, table: PageTable, device: torch.device):
        self.cfg = cfg
        self.table = table
        self.device = device
        max_bs = cfg.max_batch_size
        split_bytes = cfg.num_qo_heads * (cfg.head_dim + 1) * 4
        decode_ws_bytes = max_bs * cfg.max_splits * split_bytes + (8 << 20)
        self.float_ws = torch.empty(decode_ws_bytes, dtype=torch.uint8, device=device)  # ok: FC105
        self.prefill_ws = torch.empty(PREFILL_WS_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self._plan_info: Dict[int, int] = {}  # ok: FC103
        self.eager_decode = BatchDecodeWithPagedKVCacheWrapper(
            self.float_ws, "NHD", use_tensor_cores=True, backend="fa2"
        )
        self.score_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.float_ws, "NHD", backend="fa2")
        self.prefill = BatchPrefillWithPagedKVCacheWrapper(self.prefill_ws, "NHD", backend="fa2")
        if cfg.use_trtllm:
            trtllm_bytes = max_bs * cfg.num_qo_heads * cfg.max_splits * cfg.head_dim * 4
            self.trtllm_ws = torch.empty(trtllm_bytes, dtype=torch.uint8, device=device)  # expect: FC105
        else:
            self.trtllm_ws = None
        self.kv_indptr_gpu = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_indices_gpu = torch.zeros(max_bs * cfg.max_pages_per_req, dtype=torch.int32, device=device)
        self.last_page_len_gpu = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.seq_lens_gpu = torch.zeros(max_bs, dtype=torch.int32, device=device)
        self.graph_decode: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.graph_workspace: Optional[torch.Tensor] = None

    # ---- set-up for graphs -------------------------------------------------

    def init_cuda_graph_state(self, max_bs: int, graph_workspace: torch.Tensor) -> None:
        self.graph_workspace = graph_workspace
        self.cuda_graph_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.cuda_graph_kv_indices = torch.zeros(
            max_bs * self.cfg.max_pages_per_req, dtype=torch.int32, device=self.device
        )
        self.cuda_graph_last_page_len = torch.empty(max_bs, dtype=torch.int32, device=self.device)
        self.cuda_graph_last_page_len.fill_(1)  # ok: FC104

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.graph_workspace,
            "NHD",
            use_cuda_graph=True,
            use_tensor_cores=True,
            paged_kv_indptr_buffer=self.cuda_graph_kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.cuda_graph_kv_indices,
            paged_kv_last_page_len_buffer=self.cuda_graph_last_page_len[:bs],
            backend="fa2",
        )
        self.kv_indptr_cpu[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
        self.last_page_len_cpu[:bs] = 1
        w.plan(
            self.kv_indptr_cpu[: bs + 1],
            self.cuda_graph_kv_indices[:bs],
            self.last_page_len_cpu[:bs],
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            data_type=torch.bfloat16,
        )
        self.graph_decode[bs] = w

    # ---- per step ----------------------------------------------------------

    def _fill_host_indptr(self, rows_cpu: torch.Tensor, bs: int) -> None:
        counts = self.table.page_counts_cpu[rows_cpu]
        self.kv_indptr_cpu[0] = 0
        self.kv_indptr_cpu[1 : bs + 1] = torch.cumsum(counts, 0)
        self.last_page_len_cpu[:bs] = self.table.last_page_len_cpu[rows_cpu]

    def stage_decode_inputs(self, bs: int, padded_bs: int, rows_cpu: torch.Tensor, rows_gpu: torch.Tensor) -> None:
        self._fill_host_indptr(rows_cpu, bs)
        self.kv_indptr_cpu[bs + 1 : padded_bs + 1] = self.kv_indptr_cpu[bs]
        total = int(self.kv_indptr_cpu[bs])  # ok: FC101
        self.cuda_graph_kv_indptr[: padded_bs + 1].copy_(self.kv_indptr_cpu[: padded_bs + 1], non_blocking=True)  # ok: FC104
        _pack_pages_kernel[(bs,)](self.table.req_to_page, rows_gpu, self.cuda_graph_kv_indptr, self.cuda_graph_kv_indices, self.table.req_to_page.stride(0), BLOCK=128)  # ok: FC104
        self._plan_info[padded_bs] = total
        w = self.graph_decode[padded_bs]
        w.plan(  # ok: FC102
            self.kv_indptr_cpu[: padded_bs + 1],
            self.cuda_graph_kv_indices,
            self.last_page_len_cpu[:padded_bs],
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            data_type=torch.bfloat16,
        )
        self.cuda_graph_last_page_len[bs:padded_bs].fill_(1)  # expect: FC104

    def init_forward_metadata_replay_cuda_graph(self, bs: int, padded_bs: int, rows_cpu, rows_gpu) -> None:
        self.stage_decode_inputs(bs, padded_bs, rows_cpu, rows_gpu)

    def init_forward_metadata(self, bs: int, rows_cpu: torch.Tensor, rows_gpu: torch.Tensor, prefill: Optional[PrefillBatch] = None) -> None:
        self._fill_host_indptr(rows_cpu, bs)
        self.kv_indptr_gpu[: bs + 1].copy_(self.kv_indptr_cpu[: bs + 1], non_blocking=True)
        _pack_pages_kernel[(bs,)](self.table.req_to_page, rows_gpu, self.kv_indptr_gpu, self.kv_indices_gpu, self.table.req_to_page.stride(0), BLOCK=128)
        if prefill is not None:
            self._plan_prefill(prefill)
        else:
            self._plan_eager_decode(bs)

    def _make_plan_inputs(self, bs: int) -> DecodePlanInputs:
        self.last_page_len_gpu[:bs].copy_(self.last_page_len_cpu[:bs], non_blocking=True)
        return DecodePlanInputs(
            kv_indptr=self.kv_indptr_gpu[: bs + 1],
            kv_indices=self.kv_indices_gpu,
            last_page_len=self.last_page_len_gpu[:bs],
            bs=bs,
        )

    def _plan_eager_decode(self, bs: int) -> None:
        inp = self._make_plan_inputs(bs)
        self.eager_decode.plan(  # expect: FC102
            inp.kv_indptr,
            inp.kv_indices,
            inp.last_page_len,
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            data_type=torch.bfloat16,
        )
        self.score_wrapper.plan(  # ok: FC102
            self.kv_indptr_cpu[: bs + 1],
            self.kv_indices_gpu,
            self.last_page_len_cpu[:bs],
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            data_type=torch.bfloat16,
        )

    def _plan_prefill(self, batch: PrefillBatch) -> None:
        bs = batch.bs
        qo_indptr = torch.tensor(batch.qo_indptr_list, dtype=torch.int32).to(self.device, non_blocking=True)
        self.prefill.plan(  # expect: FC102
            qo_indptr,
            self.kv_indptr_cpu[: bs + 1],
            self.kv_indices_gpu,
            self.last_page_len_cpu[:bs],
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            causal=True,
            q_data_type=torch.bfloat16,
        )

    # ---- attention ---------------------------------------------------------

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, bs: int, in_graph: bool) -> torch.Tensor:
        if self.trtllm_ws is not None and not in_graph:
            return trtllm_batch_decode_with_kv_cache(
                q, kv_cache, self.trtllm_ws, self.table.req_to_page[:bs], self.seq_lens_gpu[:bs],
                self.cfg.max_pages_per_req * self.cfg.page_size,
            )
        w = self.graph_decode[bs] if in_graph else self.eager_decode
        return w.run(q, kv_cache)  # ok: FC108

    def forward_prefill(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.prefill.run(q, kv_cache)

    def window_mass(self, q_win: torch.Tensor, kv_cache: torch.Tensor, page_key_means: torch.Tensor) -> torch.Tensor:
        # normaliser of the window queries over the whole (compacted) context
        _, lse = self.score_wrapper.run_return_lse(q_win, kv_cache)  # expect: FC108
        logits = torch.einsum("bhd,bphd->bhp", q_win.float(), page_key_means.float())
        mass = torch.exp(logits - lse.unsqueeze(-1)).sum(dim=1)
        return mass
