"""FlashInfer wrappers per request kind: ragged bidirectional prefill for embeddings, paged prefill and
decode for generation, graph-mode decode wrappers for pure-decode steps."""
from dataclasses import dataclass
from typing import Dict, Optional

import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
)

from egm.requests import MixedBatch

_WS_BYTES = {"embed": 128 << 20, "generate": 256 << 20}
_PLAN_INFO = "_plan_info"


@dataclass
class EngineLimits:
    max_embed_tokens: int = 16384
    max_gen_tokens: int = 8192
    max_decode_bs: int = 256
    num_qo_heads: int = 16
    num_kv_heads: int = 16
    head_dim: int = 128
    page_size: int = 16
    num_pages: int = 65536
    use_trtllm: bool = False


@dataclass
class StepMeta:
    decode_wrapper: BatchDecodeWithPagedKVCacheWrapper
    num_embed_tokens: int = 0
    num_prefill_tokens: int = 0
    num_decode: int = 0
    embed_rows: Optional[torch.Tensor] = None


def _decode_kwargs(use_trtllm: bool) -> dict:
    kw = {"use_tensor_cores": True}
    if use_trtllm:
        kw["backend"] = "trtllm-gen"
    return kw


class MixedFlashInferBackend:
    def __init__(self, lim: EngineLimits, device: torch.device):
        self.lim = lim
        self.device = device
        self.use_trtllm = lim.use_trtllm
        self._kv_layout = "NHD"
        self._plan_info: Optional[tuple] = None
        embed_ws_bytes = lim.max_embed_tokens * lim.num_qo_heads * (lim.head_dim + 1) * 4
        self.embed_workspace = torch.empty(embed_ws_bytes, dtype=torch.uint8, device=device)  # ok: FC105
        self.gen_workspace = torch.zeros(_WS_BYTES["generate"], dtype=torch.uint8, device=device)  # expect: FC106
        self.decode_workspace = torch.empty(lim.max_decode_bs * lim.num_qo_heads * lim.head_dim * 64, dtype=torch.uint8, device=device)  # expect: FC105
        self.embed_wrapper = BatchPrefillWithRaggedKVCacheWrapper(self.embed_workspace, self._kv_layout, backend="fa2")
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.gen_workspace, self._kv_layout)
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(
            self.decode_workspace, self._kv_layout, **_decode_kwargs(lim.use_trtllm)
        )
        self.kv_indptr_host = torch.zeros(lim.max_decode_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_host = torch.ones(lim.max_decode_bs, dtype=torch.int32, pin_memory=True)
        self.embed_lens_host: Optional[torch.Tensor] = None
        self.embed_max_len = 0
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.forward_metadata: Optional[StepMeta] = None

    def _heads(self):
        lim = self.lim
        return lim.num_qo_heads, lim.num_kv_heads, lim.head_dim

    def report_embed_plan(self) -> Dict[str, object]:
        return {
            "flashinfer_plan": getattr(self.embed_wrapper, _PLAN_INFO, None),  # expect: FC103
            "last_plan": self._plan_info,  # ok: FC103
        }

    # ---- set-up -------------------------------------------------------------------------------

    def init_cuda_graph_state(self, max_bs: int) -> None:
        lim = self.lim
        self.graph_workspace = torch.zeros(max_bs * lim.num_qo_heads * lim.head_dim * 32, dtype=torch.uint8, device=self.device)  # ok: FC106
        self.cuda_graph_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.cuda_graph_kv_indices = torch.zeros(lim.num_pages, dtype=torch.int32, device=self.device)
        self.cuda_graph_last_page_len = torch.empty(max_bs, dtype=torch.int32, device=self.device)
        self.cuda_graph_last_page_len.fill_(1)  # ok: FC104

    # ---- per step -----------------------------------------------------------------------------

    def _plan_embed(self, fb: MixedBatch) -> None:
        self.embed_max_len = int(max(fb.embed_seq_lens))  # expect: FC101
        self.embed_wrapper.plan(  # expect: FC102
            fb.embed_cu_seqlens,
            fb.embed_cu_seqlens,
            *self._heads(),
            causal=False,
            q_data_type=torch.bfloat16,
        )

    def _plan_generate(self, fb: MixedBatch) -> None:
        if not bool(fb.gen_seq_lens_cpu.any()):  # ok: FC101
            return
        npf = fb.num_prefill
        page = self.lim.page_size
        if npf:
            self.prefill_wrapper.plan(  # ok: FC102
                fb.gen_qo_indptr_cpu[: npf + 1],
                fb.gen_kv_indptr_cpu[: npf + 1],
                fb.gen_kv_indices,
                fb.gen_last_page_len_cpu[:npf],
                *self._heads(),
                page,
                causal=True,
                q_data_type=torch.bfloat16,
            )
        if fb.num_decode:
            dec = fb.gen_kv_indptr_cpu[npf:] - fb.gen_kv_indptr_cpu[npf]
            n = fb.num_decode
            self.kv_indptr_host[: n + 1] = dec
            self.last_page_len_host[:n] = fb.gen_last_page_len_cpu[npf:]
            self.decode_wrapper.plan(
                self.kv_indptr_host[: n + 1],
                fb.gen_kv_indices[int(fb.gen_kv_indptr_cpu[npf]) :],
                self.last_page_len_host[:n],
                *self._heads(),
                page,
                q_data_type=torch.bfloat16,
            )

    def init_forward_metadata(self, fb: MixedBatch) -> None:
        embed_rows = torch.nonzero(fb.is_embed).squeeze(1)  # expect: FC101
        n_embed_tokens = int(fb.embed_cu_seqlens_cpu[-1])  # ok: FC101
        if fb.num_embed:
            if self.embed_lens_host is None or self.embed_lens_host.numel() < fb.num_embed:
                self.embed_lens_host = torch.empty(fb.num_embed, dtype=torch.int32, pin_memory=True)  # ok: FC107
            self.embed_lens_host[: fb.num_embed] = fb.embed_cu_seqlens_cpu.diff()
            self._plan_embed(fb)
        if fb.num_prefill or fb.num_decode:
            self._plan_generate(fb)
        self._plan_info = (fb.num_embed, fb.num_prefill, fb.num_decode)
        self.forward_metadata = StepMeta(
            decode_wrapper=self.decode_wrapper,
            num_embed_tokens=n_embed_tokens,
            num_prefill_tokens=int(fb.gen_qo_indptr_cpu[fb.num_prefill]),
            num_decode=fb.num_decode,
            embed_rows=embed_rows,
        )

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.graph_workspace,
            self._kv_layout,
            use_cuda_graph=True,
            use_tensor_cores=True,
            paged_kv_indptr_buffer=self.cuda_graph_kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.cuda_graph_kv_indices,
            paged_kv_last_page_len_buffer=self.cuda_graph_last_page_len[:bs],
        )
        self.graph_wrappers[bs] = w
        self.kv_indptr_host[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
        self.last_page_len_host[:bs] = 1
        w.plan(
            self.kv_indptr_host[: bs + 1],
            self.cuda_graph_kv_indices[:bs],
            self.last_page_len_host[:bs],
            *self._heads(),
            self.lim.page_size,
        )
        self.forward_metadata = StepMeta(decode_wrapper=w, num_decode=bs)

    def _plan_decode_graph(self, bs: int, raw_bs: int, dec_indptr_cpu: torch.Tensor, last_cpu: torch.Tensor) -> None:
        self.kv_indptr_host[: raw_bs + 1] = dec_indptr_cpu
        self.kv_indptr_host[raw_bs + 1 : bs + 1] = dec_indptr_cpu[-1]
        self.last_page_len_host[:raw_bs] = last_cpu
        self.last_page_len_host[raw_bs:bs] = 1
        self.graph_wrappers[bs].plan(  # ok: FC102
            self.kv_indptr_host[: bs + 1],
            self.cuda_graph_kv_indices,
            self.last_page_len_host[:bs],
            *self._heads(),
            self.lim.page_size,
        )

    def init_forward_metadata_replay_cuda_graph(self, bs: int, raw_bs: int, fb: MixedBatch) -> None:
        dec_indptr_cpu = fb.gen_kv_indptr_cpu - fb.gen_kv_indptr_cpu[0]
        total = int(dec_indptr_cpu[-1])
        self.cuda_graph_kv_indptr[: raw_bs + 1].copy_(dec_indptr_cpu, non_blocking=True)  # ok: FC104
        self.cuda_graph_kv_indices[:total].copy_(fb.gen_kv_indices)
        self.cuda_graph_last_page_len[:raw_bs].copy_(fb.gen_last_page_len_cpu, non_blocking=True)
        self._plan_decode_graph(bs, raw_bs, dec_indptr_cpu, fb.gen_last_page_len_cpu)
        self.cuda_graph_kv_indptr[raw_bs + 1 : bs + 1] = total  # expect: FC104
        self.forward_metadata = StepMeta(decode_wrapper=self.graph_wrappers[bs], num_decode=raw_bs)

    # ---- kernels ------------------------------------------------------------------------------

    def forward_embed(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.embed_wrapper.run(q, k, v)

    def forward_prefill(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.prefill_wrapper.run(q, kv_cache)

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        if self.use_trtllm:
            # trtllm-gen plans nothing on the host, so the eager wrapper is safe to use directly
            return self.decode_wrapper.run(q, kv_cache)  # expect: FC108
        return self.forward_metadata.decode_wrapper.run(q, kv_cache)  # ok: FC108
