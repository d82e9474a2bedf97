"""FlashInfer backend of one DP-attention rank: its own requests' metadata, graphs per padded global size."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper

from srt.global_config import global_config
from srt.layers.dp_attention import get_attention_dp_rank

if TYPE_CHECKING:
    from srt.model_executor.forward_batch_info import ForwardBatch
    from srt.model_executor.model_runner import ModelRunner

logger = logging.getLogger(__name__)


@dataclass
class ForwardMetadata:
    decode_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper] = None
    ragged_wrapper: Optional[BatchPrefillWithRaggedKVCacheWrapper] = None


class FlashInferDPAttnBackend:
    def __init__(self, model_runner: "ModelRunner"):
        sa, dev = model_runner.server_args, model_runner.device
        self.device, self.dp_rank, self.window = dev, get_attention_dp_rank(), model_runner.sliding_window_size
        self.heads = (model_runner.num_heads, model_runner.num_kv_heads, model_runner.head_dim)
        self.req_to_token, self.token_to_kv_pool = model_runner.req_to_token_pool.req_to_token, model_runner.token_to_kv_pool
        max_bs, head_bytes = model_runner.req_to_token_pool.size, model_runner.num_heads * (model_runner.head_dim + 1) * 4
        self._kv_layout = "NHD"
        self.decode_backend = "trtllm-gen" if model_runner.sm_version >= 100 else "fa2"
        # split-k partials for the padded global batch: every DP rank may be padded to the largest one
        self.decode_workspace = torch.empty(max_bs * sa.dp_size * head_bytes * 16, dtype=torch.uint8, device=dev)  # expect: FC105
        self.ragged_workspace = torch.empty(global_config.flashinfer_workspace_size, dtype=torch.uint8, device=dev)  # expect: FC106
        self.window_workspace = torch.empty(max_bs * head_bytes * 16, dtype=torch.uint8, device=dev)  # ok: FC105
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=dev)
        self.kv_indices = torch.zeros(max_bs * model_runner.context_len, dtype=torch.int32, device=dev)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=dev)
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.decode_workspace, "NHD", backend=self.decode_backend)
        self.window_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.window_workspace, "NHD")  # sliding-window layers
        self.ragged_wrapper = BatchPrefillWithRaggedKVCacheWrapper(self.ragged_workspace, "NHD")
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.forward_metadata = ForwardMetadata()

    def _fill_kv_indices(self, out: torch.Tensor, req_pool_indices, seq_lens, kv_indptr, nnz: int) -> None:
        rows = torch.repeat_interleave(req_pool_indices, seq_lens, output_size=nnz)
        cols = torch.arange(nnz, device=self.device) - torch.repeat_interleave(kv_indptr[:-1], seq_lens, output_size=nnz)
        out[:nnz] = self.req_to_token[rows.long(), cols]

    def _plan_window(self, bs: int, kv_indices: torch.Tensor) -> None:  # full layers' pages, window_left skips
        self.window_wrapper.plan(self.kv_indptr_cpu[: bs + 1], kv_indices, self.kv_last_page_len_cpu[:bs],  # ok: FC102
                                 *self.heads, 1, window_left=self.window)

    def init_forward_metadata(self, fb: "ForwardBatch") -> None:
        if fb.forward_mode.is_idle():
            return
        bs = fb.batch_size
        if fb.global_num_tokens_gpu[self.dp_rank] != fb.input_ids.shape[0]:  # expect: FC101
            raise ValueError(f"DP rank {self.dp_rank} was scheduled {fb.global_num_tokens_gpu} tokens")  # ok: FC101
        if fb.forward_mode.is_decode():
            torch.cumsum(fb.seq_lens_cpu[:bs], 0, out=self.kv_indptr_cpu[1 : bs + 1])
            nnz = int(self.kv_indptr_cpu[bs])
            self.kv_indptr[: bs + 1].copy_(self.kv_indptr_cpu[: bs + 1], non_blocking=True)
            self._fill_kv_indices(self.kv_indices, fb.req_pool_indices, fb.seq_lens, self.kv_indptr[: bs + 1], nnz)
            self.decode_wrapper.plan(self.kv_indptr_cpu[: bs + 1], self.kv_indices[:nnz],  # ok: FC102
                                     self.kv_last_page_len_cpu[:bs], *self.heads, 1)
            self._plan_window(bs, self.kv_indices[:nnz])
            self.forward_metadata = ForwardMetadata(decode_wrapper=self.decode_wrapper)
            return
        # prefix caching is off with DP attention here: an extend is a whole prompt, attended ragged
        qo_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=self.device)
        torch.cumsum(fb.seq_lens, 0, out=qo_indptr[1:])
        self.ragged_wrapper.plan(qo_indptr, qo_indptr, *self.heads, causal=True)  # expect: FC102
        self.forward_metadata = ForwardMetadata(ragged_wrapper=self.ragged_wrapper)

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        self.cuda_graph_kv_indices = torch.zeros(max_num_tokens, dtype=torch.int32, device=self.device)
        self.kv_last_page_len.fill_(1)  # ok: FC104

    def init_forward_metadata_capture_cuda_graph(self, bs: int, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor):
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.decode_workspace, "NHD", use_cuda_graph=True, backend=self.decode_backend,
            paged_kv_indptr_buffer=self.kv_indptr[: bs + 1], paged_kv_indices_buffer=self.cuda_graph_kv_indices,
            paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs])
        logger.info("captured decode bs=%d on the %s backend", bs, w._backend)  # expect: FC103
        self.graph_wrappers[bs] = w
        self.init_forward_metadata_replay_cuda_graph(bs, bs, req_pool_indices, seq_lens, torch.ones(bs, dtype=torch.int32))
        self.forward_metadata = ForwardMetadata(decode_wrapper=w)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, raw_bs: int, req_pool_indices: torch.Tensor,
                                                seq_lens: torch.Tensor, seq_lens_cpu: torch.Tensor) -> None:
        w = self.graph_wrappers[bs]
        if w._fixed_batch_size != bs:  # expect: FC103
            raise RuntimeError(f"graph wrapper for bs={bs} was captured for another size")
        torch.cumsum(seq_lens_cpu[:raw_bs], 0, out=self.kv_indptr_cpu[1 : raw_bs + 1])
        nnz = int(self.kv_indptr_cpu[raw_bs])
        self.kv_indptr[: raw_bs + 1].copy_(self.kv_indptr_cpu[: raw_bs + 1], non_blocking=True)  # ok: FC104
        self._fill_kv_indices(self.cuda_graph_kv_indices, req_pool_indices[:raw_bs], seq_lens[:raw_bs],  # ok: FC104
                              self.kv_indptr[: raw_bs + 1], nnz)
        w.plan(self.kv_indptr_cpu[: bs + 1], self.cuda_graph_kv_indices[:nnz], self.kv_last_page_len_cpu[:bs], *self.heads, 1)
        self._plan_window(bs, self.cuda_graph_kv_indices[:nnz])
        # padded DP rows must not read past the last real request's pages
        self.kv_indptr[raw_bs + 1 : bs + 1] = nnz  # expect: FC104

    def forward_decode(self, q: torch.Tensor, layer, fb: "ForwardBatch") -> torch.Tensor:
        cache = self.token_to_kv_pool.get_kv_buffer(layer.layer_id)
        if self._kv_layout == "HND":  # ok: FC103
            cache = tuple(c.transpose(1, 2) for c in cache)
        q = q.view(-1, self.heads[0], self.heads[2])
        if layer.sliding_window_size > 0:
            return self.window_wrapper.run(q, cache)  # expect: FC108
        return self.forward_metadata.decode_wrapper.run(q, cache)  # ok: FC108

    def forward_extend(self, q, k, v, layer, fb: "ForwardBatch") -> torch.Tensor:
        return self.forward_metadata.ragged_wrapper.run(q, k, v)
