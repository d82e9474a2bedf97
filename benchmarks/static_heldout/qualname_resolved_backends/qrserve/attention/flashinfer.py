"""FlashInfer attention backend.

Nothing in the engine imports this module by name. ``GPUModelRunner`` finds ``FlashInferBackend`` with
``getattr(importlib.import_module(cfg.backend_module), cfg.backend_cls)``; the backend names its builder and impl by
qualified name; the builder resolves its graph-workspace factory from the platform table and its attention plugins
from ``ATTENTION_PLUGINS``; the impl imports the decode kernel module the platform table names (the trtllm-gen
kernels in the ``qrserve_kernels`` namespace folder on Blackwell).
"""

from __future__ import annotations

import functools
import importlib
import logging
from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional

import flashinfer
import numpy as np
import torch
import torch.nn.functional as F
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, MultiLevelCascadeAttentionWrapper

from qrserve import config as qcfg
from qrserve.attention.abstract import (
    AttentionBackend,
    AttentionImpl,
    AttentionMetadataBuilder,
    CommonAttentionMetadata,
    split_decodes_and_prefills,
)
from qrserve.config import ATTENTION_PLUGINS, PLAN_INFO_ATTR, SLIDING_WINDOW_PLUGIN, EngineConfig
from qrserve.utils import cdiv, load_plugin, resolve_obj_by_qualname, round_up

logger = logging.getLogger(__name__)

_GRAPH_WS_BYTES = 64 * 1024 * 1024

# Short names of the platform table -> FlashInfer decode backends.
_DECODE_BACKENDS = {"fa2": "fa2", "trtllm": "trtllm-gen"}

# FlashInfer prefill wrappers by KV layout, looked up on the flashinfer module.
PREFILL_WRAPPER_CLS = {
    "paged": "BatchPrefillWithPagedKVCacheWrapper",
    "ragged": "BatchPrefillWithRaggedKVCacheWrapper",
}


@functools.lru_cache(maxsize=None)
def graph_workspace(device: torch.device) -> torch.Tensor:
    """Float workspace shared by the graph-mode decode wrappers (named in the platform table)."""
    return torch.zeros(_GRAPH_WS_BYTES, dtype=torch.uint8, device=device)  # expect: FC106


def _kv_gather_index(pages: np.ndarray, stride: int) -> np.ndarray:
    """Flat block-table positions of each request's pages, requests one after another."""
    rows = np.repeat(np.arange(pages.shape[0]), pages)
    starts = np.repeat(np.cumsum(pages) - pages, pages)
    cols = np.arange(rows.shape[0]) - starts
    return rows * stride + cols


class FlashInferBackend(AttentionBackend):
    builder_qualname = "qrserve.attention.flashinfer.FlashInferMetadataBuilder"
    impl_qualname = "qrserve.attention.flashinfer.FlashInferImpl"

    @staticmethod
    def get_name() -> str:
        return "FLASHINFER"

    @staticmethod
    def get_kv_cache_shape(num_blocks: int, page_size: int, num_kv_heads: int, head_size: int) -> tuple[int, ...]:
        return (2, num_blocks, page_size, num_kv_heads, head_size)


@dataclass
class FlashInferMetadata:
    num_actual_tokens: int  # tokens of real requests; the runner pads input_ids past it for graphs
    num_decodes: int
    num_decode_tokens: int
    num_prefills: int
    max_query_len: int
    max_seq_len: int
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    decode_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper]
    prefill_wrapper: Any
    cascade_wrapper: Optional[MultiLevelCascadeAttentionWrapper]
    softcap_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper]
    use_cascade: bool
    prefill_qo_indptr: Optional[torch.Tensor] = None
    prefill_kv_indptr: Optional[torch.Tensor] = None
    padded_bs: Optional[int] = None
    plugins: dict[str, Any] = field(default_factory=dict)
    plugin_meta: dict[str, Any] = field(default_factory=dict)


class FlashInferMetadataBuilder(AttentionMetadataBuilder[FlashInferMetadata]):
    # Inputs the trtllm-gen kernel and the KV write read inside the captured graph.
    _GRAPH_INPUTS: ClassVar[tuple[str, ...]] = ("seq_lens", "slot_mapping")

    def __init__(self, cfg: EngineConfig, device: torch.device, table: dict[str, Optional[str]]):
        self.cfg = cfg
        self.device = device
        self.page_size = cfg.page_size
        self.num_qo_heads = cfg.num_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.q_dtype = torch.bfloat16
        self.kv_dtype = torch.bfloat16
        self.logits_soft_cap = cfg.logits_soft_cap
        self._capture_sizes = sorted(cfg.cudagraph_capture_sizes)
        self._graph_enabled = cfg.mode == "graph" and table.get("decode_kernel") is None
        self._max_pages_per_req = cdiv(cfg.max_model_len, cfg.page_size)

        max_reqs = cfg.max_num_seqs
        max_pages = max_reqs * 64
        # Persistent device buffers (the graph-mode wrappers are bound to them) and their pinned host mirrors.
        self.paged_kv_indptr = torch.zeros(max_reqs + 1, dtype=torch.int32, device=device)
        self.paged_kv_indptr_cpu = torch.zeros(max_reqs + 1, dtype=torch.int32, pin_memory=True)
        self.paged_kv_indptr_np = self.paged_kv_indptr_cpu.numpy()
        self.paged_kv_indices = torch.zeros(max_pages, dtype=torch.int32, device=device)
        self.paged_kv_last_page_len = torch.zeros(max_reqs, dtype=torch.int32, device=device)
        self.paged_kv_last_page_len.fill_(1)  # ok: FC104
        self.paged_kv_last_page_len_cpu = torch.ones(max_reqs, dtype=torch.int32, pin_memory=True)
        self.paged_kv_last_page_len_np = self.paged_kv_last_page_len_cpu.numpy()
        self.kv_gather = torch.zeros(max_reqs * self._max_pages_per_req, dtype=torch.int64, device=device)
        self.kv_gather_cpu = torch.zeros(max_reqs * self._max_pages_per_req, dtype=torch.int64, pin_memory=True)
        self.seq_lens = torch.zeros(max_reqs, dtype=torch.int32, device=device)
        self.slot_mapping = torch.zeros(cfg.max_num_batched_tokens, dtype=torch.int64, device=device)

        # Shared-prefix (cascade) level, allocated on the first batch that has one.
        self._shared_prefix_indices: Optional[torch.Tensor] = None
        self._shared_qo_indptr_cpu = torch.zeros(2, dtype=torch.int32, pin_memory=True)
        self._shared_kv_indptr_cpu = torch.zeros(2, dtype=torch.int32, pin_memory=True)
        self._shared_last_page_len_cpu = torch.zeros(1, dtype=torch.int32, pin_memory=True)

        # Eager wrappers.
        self._prefill_workspace = torch.empty(qcfg.FLASHINFER_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        prefill_cls = getattr(flashinfer, PREFILL_WRAPPER_CLS["paged"])
        self._prefill_wrapper = prefill_cls(self._prefill_workspace, "NHD")

        decode_backend = _DECODE_BACKENDS[table["decode_backend"]]
        self._decode_workspace = torch.empty(self._decode_ws_bytes(), dtype=torch.uint8, device=device)  # expect: FC105
        self._decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self._decode_workspace, "NHD", backend=decode_backend)

        self._softcap_workspace = torch.empty(self._decode_ws_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self._softcap_wrapper = (
            None
            if cfg.logits_soft_cap is None
            else BatchDecodeWithPagedKVCacheWrapper(self._softcap_workspace, "NHD", backend="fa2")
        )

        self._cascade_workspace = torch.zeros(self._cascade_ws_bytes(), dtype=torch.uint8, device=device)  # ok: FC106
        self._cascade_wrapper = MultiLevelCascadeAttentionWrapper(2, self._cascade_workspace, "NHD")

        self._ragged_workspace = torch.empty(self._cascade_ws_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self._ragged_wrapper = getattr(flashinfer, PREFILL_WRAPPER_CLS["ragged"])(self._ragged_workspace, "NHD")

        # Graph-mode decode wrappers, one per padded batch size, made on first use.
        self._graph_workspace = resolve_obj_by_qualname(table["graph_workspace"])
        self._graph_decode_wrappers: dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}

        self.plugins: dict[str, Any] = {
            name: load_plugin(ATTENTION_PLUGINS[name])(self, cfg) for name in cfg.attention_plugins
        }
        for name, plugin in self.plugins.items():
            logger.info("attention plugin %s runs on FlashInfer %s", name, plugin._backend)  # ok: FC103

        self._last_decode_key: Optional[tuple[int, int]] = None
        self._plan_info: Optional[tuple[int, int]] = None

    # -- sizes ---------------------------------------------------------------------------------------------------

    def _decode_ws_bytes(self) -> int:
        # split-k partial outputs (fp32 out + lse) for every decode row at the deepest split
        per_row = self.num_qo_heads * (self.head_dim + 1) * 4
        return self.cfg.max_num_seqs * per_row * 16 + self.cfg.max_num_seqs * 1024

    def _cascade_ws_bytes(self) -> int:
        per_token = self.num_qo_heads * (self.head_dim + 1) * 4
        return round_up(self.cfg.max_num_batched_tokens * per_token * 4, 1 << 20)

    def _padded_bs(self, num_reqs: int) -> int:
        for size in self._capture_sizes:
            if size >= num_reqs:
                return size
        return num_reqs

    # -- wrappers ------------------------------------------------------------------------------------------------

    def _get_graph_decode_wrapper(self, bs: int) -> BatchDecodeWithPagedKVCacheWrapper:
        wrapper = self._graph_decode_wrappers.get(bs)
        if wrapper is None:
            wrapper = BatchDecodeWithPagedKVCacheWrapper(
                self._graph_workspace(self.device),
                "NHD",
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.paged_kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.paged_kv_indices,
                paged_kv_last_page_len_buffer=self.paged_kv_last_page_len[:bs],
            )
            self._graph_decode_wrappers[bs] = wrapper
        return wrapper

    def named_wrappers(self) -> list[tuple[str, Any]]:
        wrappers: list[tuple[str, Any]] = [
            ("decode", self._decode_wrapper),
            ("prefill", self._prefill_wrapper),
            ("ragged", self._ragged_wrapper),
            ("cascade", self._cascade_wrapper),
        ]
        wrappers += [(f"decode_graph_{bs}", w) for bs, w in self._graph_decode_wrappers.items()]
        return wrappers

    # -- per step ------------------------------------------------------------------------------------------------

    def _fill_paged_kv(self, common: CommonAttentionMetadata) -> int:
        """Host indptr / last-page lengths, then the page ids gathered from the device block table."""
        num_reqs = common.num_reqs
        seq_lens_np = common.seq_lens_cpu[:num_reqs].numpy()
        pages = (seq_lens_np + self.page_size - 1) // self.page_size
        self.paged_kv_indptr_np[0] = 0
        np.cumsum(pages, out=self.paged_kv_indptr_np[1 : num_reqs + 1])
        self.paged_kv_last_page_len_np[:num_reqs] = seq_lens_np - (pages - 1) * self.page_size
        nnz = int(self.paged_kv_indptr_np[num_reqs])
        if nnz > self.paged_kv_indices.shape[0]:
            # long contexts outgrew the initial guess of 64 pages per request
            self.paged_kv_indices = torch.empty(round_up(nnz, 4096), dtype=torch.int32, device=self.device)  # expect: FC107
        block_table = common.block_table_tensor
        gather = _kv_gather_index(pages, block_table.shape[1])
        self.kv_gather_cpu[:nnz] = torch.from_numpy(gather)
        self.kv_gather[:nnz].copy_(self.kv_gather_cpu[:nnz], non_blocking=True)
        torch.index_select(block_table.reshape(-1), 0, self.kv_gather[:nnz], out=self.paged_kv_indices[:nnz])  # ok: FC104
        return nnz

    def build(self, common_prefix_len: int, common: CommonAttentionMetadata) -> FlashInferMetadata:
        num_reqs = common.num_reqs
        num_decodes, num_prefills, num_decode_tokens, _ = split_decodes_and_prefills(common)
        seq_lens_cpu = common.seq_lens_cpu[:num_reqs]
        max_seq_len = int(seq_lens_cpu.max())  # ok: FC101
        self._fill_paged_kv(common)

        # Own copies: the runner refills its input buffers for the next step while this one is in flight.
        for name in self._GRAPH_INPUTS:
            setattr(self, name, getattr(common, name).clone())  # expect: FC107

        use_graph = self._graph_enabled and num_prefills == 0 and num_reqs <= self._capture_sizes[-1]
        padded_bs: Optional[int] = None
        if use_graph:
            padded_bs = self._padded_bs(num_reqs)
            decode_wrapper = self._get_graph_decode_wrapper(padded_bs)
            self.stage_graph_decode(common, num_reqs, padded_bs)
        else:
            decode_wrapper = self._decode_wrapper
            if num_decodes > 0:
                self._plan_eager_decode(num_decodes)
        if num_decodes > 0 and self._softcap_wrapper is not None:
            self._plan_softcap(num_decodes)

        plugin_meta = {name: plugin.prepare(common, num_decodes) for name, plugin in self.plugins.items()}

        use_cascade = common_prefix_len > 0 and num_prefills > 0
        prefill_qo_indptr = prefill_kv_indptr = None
        if use_cascade:
            self._plan_cascade(common, common_prefix_len)
        elif num_prefills > 0:
            prefill_qo_indptr, prefill_kv_indptr = self._plan_prefill(common, num_decodes, num_decode_tokens)

        return FlashInferMetadata(
            num_actual_tokens=common.query_start_loc[num_reqs],
            num_decodes=num_decodes,
            num_decode_tokens=num_decode_tokens,
            num_prefills=num_prefills,
            max_query_len=common.max_query_len,
            max_seq_len=max_seq_len,
            seq_lens=self.seq_lens,
            block_table=common.block_table_tensor,
            slot_mapping=self.slot_mapping,
            decode_wrapper=decode_wrapper,
            prefill_wrapper=self._prefill_wrapper,
            cascade_wrapper=self._cascade_wrapper,
            softcap_wrapper=self._softcap_wrapper,
            use_cascade=use_cascade,
            prefill_qo_indptr=prefill_qo_indptr,
            prefill_kv_indptr=prefill_kv_indptr,
            padded_bs=padded_bs,
            plugins=self.plugins,
            plugin_meta=plugin_meta,
        )

    def stage_graph_decode(self, common: CommonAttentionMetadata, num_reqs: int, bs: int) -> None:
        """Fill the graph-bound decode buffers for a batch padded to ``bs`` rows, then plan its wrapper."""
        nnz = int(self.paged_kv_indptr_np[num_reqs])
        self.paged_kv_indptr[: num_reqs + 1].copy_(self.paged_kv_indptr_cpu[: num_reqs + 1], non_blocking=True)  # ok: FC104
        self.paged_kv_last_page_len[:bs].copy_(self.paged_kv_last_page_len_cpu[:bs], non_blocking=True)  # ok: FC104
        wrapper = self._get_graph_decode_wrapper(bs)
        wrapper.plan(  # expect: FC102
            self.paged_kv_indptr_cpu[: bs + 1],
            self.paged_kv_indices,
            self.paged_kv_last_page_len[:bs],
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            self.page_size,
            q_data_type=self.q_dtype,
            kv_data_type=self.kv_dtype,
        )
        # padded rows: empty requests that end where the last real one ends
        self.paged_kv_indptr[num_reqs + 1 : bs + 1].fill_(nnz)  # expect: FC104

    def _plan_eager_decode(self, num_decodes: int) -> None:
        key = (num_decodes, int(self.paged_kv_indptr_np[num_decodes]))
        if key == self._last_decode_key and getattr(self._decode_wrapper, PLAN_INFO_ATTR, None) is not None:  # expect: FC103
            return
        self._decode_wrapper.plan(  # ok: FC102
            self.paged_kv_indptr_cpu[: num_decodes + 1],
            self.paged_kv_indices,
            self.paged_kv_last_page_len_cpu[:num_decodes],
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            self.page_size,
            q_data_type=self.q_dtype,
            kv_data_type=self.kv_dtype,
        )
        self._last_decode_key = key
        self._plan_info = key  # ok: FC103

    def _plan_softcap(self, num_decodes: int) -> None:
        self._softcap_wrapper.plan(  # ok: FC102
            self.paged_kv_indptr_cpu[: num_decodes + 1],
            self.paged_kv_indices,
            self.paged_kv_last_page_len_cpu[:num_decodes],
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            self.page_size,
            logits_soft_cap=self.logits_soft_cap,
            q_data_type=self.q_dtype,
        )

    def _plan_prefill(
        self, common: CommonAttentionMetadata, num_decodes: int, num_decode_tokens: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        num_reqs = common.num_reqs
        qo_indptr = common.query_start_loc[num_decodes : num_reqs + 1] - num_decode_tokens
        kv_indptr_cpu = self.paged_kv_indptr_cpu[num_decodes : num_reqs + 1] - self.paged_kv_indptr_cpu[num_decodes]
        first_page = int(self.paged_kv_indptr_np[num_decodes])
        self._prefill_wrapper.plan(  # expect: FC102
            qo_indptr,
            kv_indptr_cpu,
            self.paged_kv_indices[first_page:],
            self.paged_kv_last_page_len_cpu[num_decodes:num_reqs],
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            self.page_size,
            causal=True,
            q_data_type=self.q_dtype,
            kv_data_type=self.kv_dtype,
        )
        kv_lens = common.seq_lens[num_decodes:num_reqs]
        prefill_kv_indptr = F.pad(torch.cumsum(kv_lens, 0, dtype=torch.int32), (1, 0))
        return qo_indptr, prefill_kv_indptr

    def _plan_cascade(self, common: CommonAttentionMetadata, common_prefix_len: int) -> None:
        num_reqs = common.num_reqs
        num_common_pages = common_prefix_len // self.page_size
        if self._shared_prefix_indices is None:
            self._shared_prefix_indices = torch.empty(self._max_pages_per_req, dtype=torch.int32, device=self.device)  # ok: FC107
        self._shared_prefix_indices[:num_common_pages].copy_(common.block_table_tensor[0, :num_common_pages])
        self._shared_qo_indptr_cpu[1] = common.num_actual_tokens
        self._shared_kv_indptr_cpu[1] = num_common_pages
        self._shared_last_page_len_cpu[0] = self.page_size
        self._cascade_wrapper.plan(  # ok: FC102
            [self._shared_qo_indptr_cpu, common.query_start_loc_cpu],
            [self._shared_kv_indptr_cpu, self.paged_kv_indptr_cpu[: num_reqs + 1]],
            [self._shared_prefix_indices[:num_common_pages], self.paged_kv_indices],
            [self._shared_last_page_len_cpu, self.paged_kv_last_page_len_cpu[:num_reqs]],
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            self.page_size,
            causal=True,
            q_data_type=self.q_dtype,
        )

    # -- capture and profiling -------------------------------------------------------------------------------------

    def build_for_cudagraph_capture(self, common: CommonAttentionMetadata) -> FlashInferMetadata:
        """Metadata of a uniform decode batch of ``common.num_reqs`` one-token requests."""
        num_reqs = common.num_reqs
        bs = self._padded_bs(num_reqs)
        self._fill_paged_kv(common)
        self.seq_lens[:num_reqs].copy_(common.seq_lens)
        self.slot_mapping[:num_reqs].copy_(common.slot_mapping)
        if self._graph_enabled:
            decode_wrapper = self._get_graph_decode_wrapper(bs)
            self.stage_graph_decode(common, num_reqs, bs)
        else:
            decode_wrapper = self._decode_wrapper
            self._plan_eager_decode(num_reqs)
        if self._softcap_wrapper is not None:
            self._plan_softcap(num_reqs)
        plugin_meta = {name: plugin.prepare(common, num_reqs) for name, plugin in self.plugins.items()}
        return FlashInferMetadata(
            num_actual_tokens=common.num_actual_tokens,
            num_decodes=num_reqs,
            num_decode_tokens=num_reqs,
            num_prefills=0,
            max_query_len=1,
            max_seq_len=int(common.seq_lens_cpu.max()),
            seq_lens=self.seq_lens[:num_reqs],
            block_table=common.block_table_tensor,
            slot_mapping=self.slot_mapping[:num_reqs],
            decode_wrapper=decode_wrapper,
            prefill_wrapper=self._prefill_wrapper,
            cascade_wrapper=self._cascade_wrapper,
            softcap_wrapper=self._softcap_wrapper,
            use_cascade=False,
            padded_bs=bs,
            plugins=self.plugins,
            plugin_meta=plugin_meta,
        )

    def profile_prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Run the largest ragged prefill once so that the memory profiler sees FlashInfer's peak."""
        n = q.shape[0]
        qo_indptr = torch.tensor([0, n], dtype=torch.int32)
        self._ragged_wrapper.plan(  # ok: FC102
            qo_indptr,
            qo_indptr,
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            causal=True,
            q_data_type=q.dtype,
        )
        return self._ragged_wrapper.run(q, k, v)  # ok: FC108


class FlashInferImpl(AttentionImpl):
    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int,
        sliding_window: Optional[int] = None,
        logits_soft_cap: Optional[float] = None,
        kernel_module: Optional[str] = None,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int = 8192,
    ):
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = scale
        self.num_kv_heads = num_kv_heads
        self.sliding_window = sliding_window
        self.logits_soft_cap = logits_soft_cap
        self.max_num_seqs = max_num_seqs
        # e.g. "qrserve_kernels.trtllm_gen" on Blackwell; None elsewhere
        self._kernel_mod = importlib.import_module(kernel_module) if kernel_module else None
        self._ctx_ws_bytes = max_num_batched_tokens * num_heads * (head_size + 1) * 4 * 2

    def forward(self, layer, query, key, value, kv_cache, attn_metadata: FlashInferMetadata, output):
        num_actual_tokens = attn_metadata.num_actual_tokens
        query = query[:num_actual_tokens]  # expect: FC101

        k_cache, v_cache = kv_cache[0], kv_cache[1]
        n_slots = attn_metadata.slot_mapping.shape[0]
        k_cache.view(-1, self.num_kv_heads, self.head_size).index_copy_(0, attn_metadata.slot_mapping, key[:n_slots])
        v_cache.view(-1, self.num_kv_heads, self.head_size).index_copy_(0, attn_metadata.slot_mapping, value[:n_slots])

        num_decode_tokens = attn_metadata.num_decode_tokens
        if attn_metadata.num_prefills > 0:
            prefill_q = query[num_decode_tokens:]
            out = self._prefill(prefill_q, kv_cache, (k_cache, v_cache), attn_metadata)
            output[num_decode_tokens : num_decode_tokens + out.shape[0]].copy_(out)
        if num_decode_tokens > 0:
            decode_q = query[:num_decode_tokens]  # ok: FC101
            output[:num_decode_tokens].copy_(self._decode(decode_q, kv_cache, (k_cache, v_cache), attn_metadata))
        return output

    def _prefill(self, q, kv_cache, paged_kv, md: FlashInferMetadata) -> torch.Tensor:
        if md.use_cascade:
            return md.cascade_wrapper.run(q, paged_kv)  # ok: FC108
        if self._kernel_mod is not None:
            nd = md.num_decodes
            return self._kernel_mod.context(
                q,
                kv_cache,
                md.block_table[nd:],
                md.seq_lens[nd:],
                md.prefill_qo_indptr,
                md.prefill_kv_indptr,
                max_q_len=md.max_query_len,
                max_kv_len=md.max_seq_len,
                batch_size=md.num_prefills,
                scale=self.scale,
                workspace_nbytes=self._ctx_ws_bytes,
            )
        return md.prefill_wrapper.run(q, paged_kv)  # ok: FC108

    def _decode(self, q, kv_cache, paged_kv, md: FlashInferMetadata) -> torch.Tensor:
        if self.sliding_window is not None:
            plugin = md.plugins[SLIDING_WINDOW_PLUGIN]
            return plugin.forward_decode(q, paged_kv, md.plugin_meta[SLIDING_WINDOW_PLUGIN])
        if self.logits_soft_cap is not None:
            return md.softcap_wrapper.run(q, paged_kv)  # expect: FC108
        if self._kernel_mod is not None:
            nd = md.num_decodes
            return self._kernel_mod.decode(
                q,
                kv_cache,
                md.block_table[:nd],
                md.seq_lens[:nd],
                max_num_seqs=self.max_num_seqs,
                scale=self.scale,
            )
        return md.decode_wrapper.run(q, paged_kv)  # ok: FC108
