"""FlashInfer attention for gpt-oss: one set of wrappers per layer type, sinks passed per layer."""
import itertools
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from gptoss.config import GptOssConfig, LayerType

if TYPE_CHECKING:
    from gptoss.layers.attention import SinkAttention


@dataclass
class ForwardBatch:
    batch_size: int
    is_decode: bool
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor          # device
    seq_lens_cpu: torch.Tensor
    qo_indptr: torch.Tensor         # device
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor        # device
    last_page_len_cpu: torch.Tensor
    block_tables: torch.Tensor      # device, for trtllm-gen


@dataclass
class ForwardMetadata:
    full_wrapper: BatchDecodeWithPagedKVCacheWrapper
    max_seq_len: int
    seq_lens: Optional[torch.Tensor] = None
    block_tables: Optional[torch.Tensor] = None


class SinkAttnBackend:
    def __init__(self, cfg: GptOssConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self._backend = "trtllm-gen" if cfg.sm_version >= 100 else "fa2"
        ws_bytes = int(os.environ.get("GPTOSS_FI_WORKSPACE_MB", "512")) << 20
        self.workspace = torch.zeros(ws_bytes, dtype=torch.uint8, device=device)  # expect: FC106
        sink_ws_bytes = cfg.max_batch_size * cfg.num_attention_heads * cfg.head_dim * 4 * 16
        self.sink_workspace = torch.empty(sink_ws_bytes, dtype=torch.uint8, device=device)  # ok: FC105
        self.sink_workspace.zero_()
        self.prefill_wrappers: Dict[LayerType, BatchPrefillWithPagedKVCacheWrapper] = {
            LayerType.FULL: BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD"),
            LayerType.SLIDING: BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD"),
        }
        self.full_decode = BatchDecodeWithPagedKVCacheWrapper(self.workspace, "NHD", use_tensor_cores=True)
        self.sw_decode = BatchDecodeWithPagedKVCacheWrapper(self.workspace, "NHD", use_tensor_cores=True)
        self.decode_wrappers = [self.full_decode, self.sw_decode]
        max_bs = cfg.max_batch_size
        # window page tables are built on the GPU from the full ones (last window_pages pages)
        self.sw_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.sw_kv_indices = torch.zeros(max_bs * cfg.window_pages, dtype=torch.int32, device=device)
        self.sw_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.full_kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.full_last_page_len_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.graph_full: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.forward_metadata: Optional[ForwardMetadata] = None
        self.native_sinks = self._all_wrappers_take_sinks()

    def _all_wrappers_take_sinks(self) -> bool:
        for w in itertools.chain(self.decode_wrappers, list(self.prefill_wrappers.values())):
            if w._backend not in ("fa2", "auto"):  # expect: FC103
                return False
        return True

    def _heads(self):
        c = self.cfg
        return c.num_attention_heads, c.num_kv_heads, c.head_dim, c.page_size

    # ---- set-up -------------------------------------------------------------------------------

    def init_cuda_graph_state(self, max_bs: int) -> None:
        self.cuda_graph_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.cuda_graph_kv_indices = torch.zeros(self.cfg.num_pages, dtype=torch.int32, device=self.device)
        self.cuda_graph_last_page_len = torch.zeros(max_bs, dtype=torch.int32, device=self.device)
        self.cuda_graph_last_page_len.fill_(1)  # ok: FC104

    # ---- window page tables ------------------------------------------------------------------

    def _build_window_tables(self, fb: ForwardBatch, bs: int) -> None:
        w = self.cfg.sliding_window
        sw_lens = torch.where(fb.seq_lens[:bs] > w, w, fb.seq_lens[:bs])  # ok: FC101
        sw_pages = (sw_lens + self.cfg.page_size - 1) // self.cfg.page_size
        torch.cumsum(sw_pages, 0, out=self.sw_kv_indptr[1 : bs + 1])
        self.sw_last_page_len[:bs].copy_((sw_lens - 1) % self.cfg.page_size + 1)

    # ---- per step -----------------------------------------------------------------------------

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        bs = fb.batch_size
        if fb.is_decode:
            self.full_decode.plan(
                fb.kv_indptr_cpu, fb.kv_indices, fb.last_page_len_cpu, *self._heads(), q_data_type=torch.bfloat16
            )
            if (fb.seq_lens[:bs] > self.cfg.sliding_window).any():  # expect: FC101
                self._build_window_tables(fb, bs)
                self.sw_decode.plan(  # expect: FC102
                    self.sw_kv_indptr[: bs + 1],
                    self.sw_kv_indices,
                    self.sw_last_page_len[:bs],
                    *self._heads(),
                    window_left=self.cfg.sliding_window - 1,
                    q_data_type=torch.bfloat16,
                )
            else:
                self.sw_decode.plan(
                    fb.kv_indptr_cpu, fb.kv_indices, fb.last_page_len_cpu, *self._heads(), q_data_type=torch.bfloat16
                )
        else:
            for kind, wrapper in self.prefill_wrappers.items():
                wrapper.plan(  # expect: FC102
                    fb.qo_indptr,
                    fb.kv_indptr_cpu,
                    fb.kv_indices,
                    fb.last_page_len_cpu,
                    *self._heads(),
                    causal=True,
                    window_left=self.cfg.sliding_window - 1 if kind is LayerType.SLIDING else -1,
                    q_data_type=torch.bfloat16,
                )
        self.forward_metadata = ForwardMetadata(
            full_wrapper=self.full_decode,
            max_seq_len=int(fb.seq_lens_cpu[:bs].max()),
            seq_lens=fb.seq_lens,
            block_tables=fb.block_tables,
        )

    def init_forward_metadata_capture_cuda_graph(self, bs: int, seq_lens: torch.Tensor) -> None:
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.workspace,
            "NHD",
            use_cuda_graph=True,
            use_tensor_cores=True,
            paged_kv_indptr_buffer=self.cuda_graph_kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.cuda_graph_kv_indices,
            paged_kv_last_page_len_buffer=self.cuda_graph_last_page_len[:bs],
        )
        self.graph_full[bs] = w
        indptr_host = torch.arange(bs + 1, dtype=torch.int32)
        w.plan(indptr_host, self.cuda_graph_kv_indices[:bs], self.full_last_page_len_host[:bs], *self._heads())
        self.forward_metadata = ForwardMetadata(full_wrapper=w, max_seq_len=self.cfg.sliding_window, seq_lens=seq_lens)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        raw_bs = fb.batch_size
        total = int(fb.kv_indptr_cpu[raw_bs])
        self.full_kv_indptr_host[: raw_bs + 1] = fb.kv_indptr_cpu[: raw_bs + 1]
        self.full_kv_indptr_host[raw_bs + 1 : bs + 1] = total
        self.full_last_page_len_host[:raw_bs] = fb.last_page_len_cpu[:raw_bs]
        self.full_last_page_len_host[raw_bs:bs] = 1
        self.cuda_graph_kv_indptr[: bs + 1].copy_(self.full_kv_indptr_host[: bs + 1], non_blocking=True)  # ok: FC104
        self.cuda_graph_kv_indices[:total].copy_(fb.kv_indices[:total])
        self.cuda_graph_last_page_len[:bs].copy_(self.full_last_page_len_host[:bs], non_blocking=True)
        w = self.graph_full[bs]
        w.plan(  # ok: FC102
            self.full_kv_indptr_host[: bs + 1],
            self.cuda_graph_kv_indices[:total],
            self.full_last_page_len_host[:bs],
            *self._heads(),
            q_data_type=torch.bfloat16,
        )
        self._build_window_tables(fb, raw_bs)
        self.sw_decode.plan(
            fb.kv_indptr_cpu, fb.kv_indices, fb.last_page_len_cpu, *self._heads(), q_data_type=torch.bfloat16
        )
        sw_max = min(self.cfg.sliding_window, max(fb.seq_lens[:raw_bs]))  # expect: FC101
        self.forward_metadata = ForwardMetadata(
            full_wrapper=w, max_seq_len=sw_max, seq_lens=fb.seq_lens, block_tables=fb.block_tables
        )

    # ---- kernels ------------------------------------------------------------------------------

    def forward_decode(self, q: torch.Tensor, kv: torch.Tensor, layer: "SinkAttention") -> torch.Tensor:
        meta = self.forward_metadata
        if self._backend == "trtllm-gen":  # ok: FC103
            return trtllm_batch_decode_with_kv_cache(
                q, kv, self.sink_workspace, meta.block_tables, meta.seq_lens, meta.max_seq_len,
                window_left=layer.window_left, sinks=[layer.sinks],
            )
        if layer.layer_type is LayerType.SLIDING:
            return self.sw_decode.run(q, kv, sinks=layer.sinks)  # expect: FC108
        return meta.full_wrapper.run(q, kv, sinks=layer.sinks)  # ok: FC108

    def forward_extend(self, q: torch.Tensor, kv: torch.Tensor, layer: "SinkAttention") -> torch.Tensor:
        return self.prefill_wrappers[layer.layer_type].run(q, kv, sinks=layer.sinks)
