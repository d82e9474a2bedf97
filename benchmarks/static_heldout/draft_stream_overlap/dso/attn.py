"""Per-model FlashInfer state: eager wrappers, graph-mode decode wrappers and their buffers."""
from dataclasses import dataclass
from typing import Dict, Optional

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from dso.config import ModelShape, SpecConfig

_WS_ATTRS = ("_float_workspace_buffer", "_int_workspace_buffer")


class StreamAwareDecodeWrapper(BatchDecodeWithPagedKVCacheWrapper):
    """Remembers the stream its plan was made on, so the draft never runs on a stale plan."""

    plan_stream: Optional[torch.cuda.Stream] = None

    def uses_trtllm(self) -> bool:
        return self._backend == "trtllm-gen"  # expect: FC103


@dataclass
class StepAttnInputs:
    batch_size: int
    qo_indptr_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len_cpu: torch.Tensor

    @classmethod
    def from_host(cls, q_lens, page_lists, last_lens, page_size, device) -> "StepAttnInputs":
        qo = np.zeros(len(q_lens) + 1, dtype=np.int32)
        np.cumsum(q_lens, out=qo[1:])
        kv = np.zeros(len(page_lists) + 1, dtype=np.int32)
        np.cumsum([len(p) for p in page_lists], out=kv[1:])
        flat = [p for pages in page_lists for p in pages]
        return cls(
            batch_size=len(q_lens),
            qo_indptr_cpu=torch.from_numpy(qo),
            kv_indptr_cpu=torch.from_numpy(kv),
            kv_indices=torch.tensor(flat, dtype=torch.int32).to(device, non_blocking=True),
            last_page_len_cpu=torch.tensor(last_lens, dtype=torch.int32),
        )


class ModelAttnState:
    GRAPH_WS_BYTES = 192 * 1024 * 1024

    def __init__(self, shape: ModelShape, scfg: SpecConfig, device: torch.device, decode_backend: str = "fa2"):
        self.shape = shape
        self.scfg = scfg
        self.device = device
        max_bs = scfg.max_batch_size
        self.float_workspace = torch.zeros(scfg.workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        self.graph_workspace = torch.zeros(self.GRAPH_WS_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.decode_ws = torch.empty(max_bs * shape.num_qo_heads * shape.head_dim * 32, dtype=torch.uint8, device=device)  # expect: FC105
        verify_rows = max_bs * (scfg.num_spec_tokens + 1)
        self.prefill_ws = torch.empty(verify_rows * shape.num_qo_heads * shape.head_dim * 8, dtype=torch.uint8, device=device)  # ok: FC105
        self.decode_backend = decode_backend
        self.decode = BatchDecodeWithPagedKVCacheWrapper(self.decode_ws, "HND", backend=self.decode_backend)
        self.prefill = BatchPrefillWithPagedKVCacheWrapper(self.prefill_ws, "HND", backend="fa2")
        self.extend = BatchPrefillWithPagedKVCacheWrapper(self.float_workspace, "HND", backend="fa2")
        self._decode_plan = self.decode.plan
        self.kv_last_page_len_device = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.graph_wrappers: Dict[int, StreamAwareDecodeWrapper] = {}
        self.graph_bs: Optional[int] = None
        self._plan_info = None

    def describe(self) -> str:
        kinds = sorted({"trtllm-gen" if w.uses_trtllm() else "fa2" for w in self.graph_wrappers.values()})
        return f"{self.shape.name}: eager decode on {self.decode_backend}, graphs on {kinds}"

    def _heads(self):
        s = self.shape
        return s.num_qo_heads, s.num_kv_heads, s.head_dim, self.scfg.page_size

    def borrow_workspace(self, other: "ModelAttnState") -> None:
        """The draft never plans a prefill while the target does: share the target's buffers."""
        bufs = []
        for attr in _WS_ATTRS:
            bufs.append(getattr(other.prefill, attr))  # expect: FC103
        self.extend.reset_workspace_buffer(*bufs)

    # ---- graph set-up -------------------------------------------------------------------------

    def init_graph_buffers(self) -> None:
        max_bs = self.scfg.max_batch_size
        self.g_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.g_kv_indices = torch.zeros(self.scfg.num_pages, dtype=torch.int32, device=self.device)
        self.g_last_page_len = torch.empty(max_bs, dtype=torch.int32, device=self.device)
        self.g_last_page_len.fill_(1)  # ok: FC104
        self.graph_bufs = {
            "kv_indptr": self.g_kv_indptr,
            "kv_indices": self.g_kv_indices,
            "kv_last_page_len": self.g_last_page_len,
        }

    def capture_wrapper(self, bs: int) -> None:
        w = StreamAwareDecodeWrapper(
            self.graph_workspace,
            "HND",
            use_cuda_graph=True,
            paged_kv_indptr_buffer=self.g_kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.g_kv_indices,
            paged_kv_last_page_len_buffer=self.g_last_page_len[:bs],
        )
        self.graph_wrappers[bs] = w
        indptr_np = np.arange(bs + 1, dtype=np.int32)
        w.plan(torch.from_numpy(indptr_np), self.g_kv_indices[:bs], torch.ones(bs, dtype=torch.int32), *self._heads())
        self.graph_bs = bs

    # ---- per step -----------------------------------------------------------------------------

    def plan_decode(self, inp: StepAttnInputs) -> None:
        bs = inp.batch_size
        self.graph_bs = None
        self.kv_last_page_len_device[:bs].copy_(inp.last_page_len_cpu, non_blocking=True)
        self._decode_plan(  # expect: FC102
            inp.kv_indptr_cpu,
            inp.kv_indices,
            self.kv_last_page_len_device[:bs],
            *self._heads(),
            q_data_type=torch.bfloat16,
        )

    def plan_verify(self, inp: StepAttnInputs) -> None:
        self.prefill.plan(  # ok: FC102
            inp.qo_indptr_cpu,
            inp.kv_indptr_cpu,
            inp.kv_indices,
            inp.last_page_len_cpu,
            *self._heads(),
            causal=True,
            q_data_type=torch.bfloat16,
        )

    def plan_extend(self, inp: StepAttnInputs) -> None:
        self.extend.plan(
            inp.qo_indptr_cpu,
            inp.kv_indptr_cpu,
            inp.kv_indices,
            inp.last_page_len_cpu,
            *self._heads(),
            causal=True,
            q_data_type=torch.bfloat16,
        )

    def prepare_replay(self, bs: int, inp: StepAttnInputs) -> None:
        raw_bs = inp.batch_size
        total = int(inp.kv_indptr_cpu[raw_bs])
        bufs = self.graph_bufs
        self.kv_indptr_host[: raw_bs + 1] = inp.kv_indptr_cpu[: raw_bs + 1]
        self.kv_indptr_host[raw_bs + 1 : bs + 1] = total
        bufs["kv_indptr"][: bs + 1].copy_(self.kv_indptr_host[: bs + 1], non_blocking=True)  # ok: FC104
        bufs["kv_indices"][:total].copy_(inp.kv_indices[:total])
        self.last_page_len_host[:raw_bs] = inp.last_page_len_cpu
        self.last_page_len_host[raw_bs:bs] = 1
        w = self.graph_wrappers[bs]
        w.plan(  # ok: FC102
            self.kv_indptr_host[: bs + 1],
            self.g_kv_indices[:total],
            self.last_page_len_host[:bs],
            *self._heads(),
            q_data_type=torch.bfloat16,
        )
        bufs["kv_last_page_len"][:bs].copy_(self.last_page_len_host[:bs], non_blocking=True)  # expect: FC104
        w.plan_stream = torch.cuda.current_stream()
        self.graph_bs = bs
        self._plan_info = (bs, total)  # ok: FC103

    # ---- kernels ------------------------------------------------------------------------------

    def decode_attention(self, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        w = self.graph_wrappers[self.graph_bs] if self.graph_bs is not None else self.decode
        return w.run(q, kv)  # ok: FC108

    def extend_attention(self, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        return self.extend.run(q, kv)  # expect: FC108

    def verify_attention(self, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        return self.prefill.run(q, kv)
