from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper

from duoserve.runner.forward_batch import ForwardBatch

if TYPE_CHECKING:
    from duoserve.runner.model_runner import ModelRunner

logger = logging.getLogger(__name__)

_WS_MIB = {"prefill": 256, "decode": 128}


def make_stream_attn(w: BatchDecodeWithPagedKVCacheWrapper) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Streaming heads attend to sink + window pages only; the wrapper was planned
    with their head counts."""

    def attn(q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        return w.run(q, kv)  # expect: FC108

    return attn


@dataclass
class DuoDecodeMeta:
    batch_size: int
    full_wrapper: BatchDecodeWithPagedKVCacheWrapper


class DuoFlashInferBackend:
    def __init__(self, model_runner: "ModelRunner"):
        cfg = model_runner.cfg
        self.device = model_runner.device
        self.pool = model_runner.kv_pool
        pattern = model_runner.head_pattern
        self.page_size = cfg.page_size
        self.group = cfg.num_heads // cfg.num_kv_heads
        self.h_r, self.h_s, self.head_dim = pattern.num_retrieval, pattern.num_streaming, cfg.head_dim
        self.max_bs = cfg.max_running_requests
        self._use_cuda_graph = not cfg.disable_cuda_graph
        blackwell = torch.cuda.get_device_capability(self.device)[0] >= 10
        # long-context retrieval heads take trtllm-gen on Blackwell
        self.decode_backends = {"full": "trtllm-gen" if blackwell else "auto", "stream": "auto"}

        self.prefill_ws = torch.zeros(_WS_MIB["prefill"] << 20, dtype=torch.uint8, device=self.device)  # expect: FC106
        self.graph_ws = torch.zeros(int(os.environ.get("DUO_GRAPH_WS_MB", cfg.graph_ws_mb)) << 20, dtype=torch.uint8, device=self.device)  # ok: FC106
        split_bytes = self.max_bs * cfg.num_heads * 32 * (self.head_dim + 2) * 4
        self.full_ws = torch.empty(split_bytes, dtype=torch.uint8, device=self.device)  # expect: FC105
        self.stream_ws = torch.empty(split_bytes // 4, dtype=torch.uint8, device=self.device)  # ok: FC105

        self.ragged = BatchPrefillWithRaggedKVCacheWrapper(self.prefill_ws, "NHD", backend="fa2")
        self.full_decode = BatchDecodeWithPagedKVCacheWrapper(self.full_ws, "HND", use_tensor_cores=self.group >= 4,
                                                              backend=self.decode_backends["full"])
        self.stream_decode = BatchDecodeWithPagedKVCacheWrapper(self.stream_ws, "HND",
                                                                backend=self.decode_backends["stream"])
        self._stream_attn = make_stream_attn(self.stream_decode)

        max_pages = self.max_bs * self.pool.max_full_pages
        self.eager_full_indptr_cpu = torch.zeros(self.max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.eager_full_indices_cpu = torch.zeros(max_pages, dtype=torch.int32, pin_memory=True)
        self.eager_full_last_cpu = torch.ones(self.max_bs, dtype=torch.int32, pin_memory=True)
        self.eager_full_indices = torch.zeros(max_pages, dtype=torch.int32, device=self.device)
        n_stream = self.max_bs * self.pool.stream_pages_per_req
        self.eager_stream_indptr = torch.zeros(self.max_bs + 1, dtype=torch.int32, device=self.device)
        self.eager_stream_indices = torch.zeros(n_stream, dtype=torch.int32, device=self.device)
        self.eager_stream_last = torch.ones(self.max_bs, dtype=torch.int32, device=self.device)
        self.stream_scratch: Optional[torch.Tensor] = None
        self.full_graph_wrappers: dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.stream_graph_wrappers: dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.forward_metadata: Optional[DuoDecodeMeta] = None

    @property
    def graphs_enabled(self) -> bool:
        return self._use_cuda_graph  # ok: FC103

    # ---- host page tables of the retrieval heads ----------------------------------------
    def _fill_full(self, slots: np.ndarray, seq_np: np.ndarray, indptr_np: np.ndarray, indices_np: np.ndarray,
                   last_np: np.ndarray) -> int:
        page = self.page_size
        pages = (seq_np + page - 1) // page
        indptr_np[0] = 0
        np.cumsum(pages, out=indptr_np[1: len(slots) + 1])
        for i, (s, p) in enumerate(zip(slots, pages)):
            indices_np[indptr_np[i]: indptr_np[i + 1]] = self.pool.req_to_full_pages_np[s, :p] if s >= 0 else 0
        last_np[: len(slots)] = seq_np - (pages - 1) * page
        return int(indptr_np[len(slots)])

    def _fill_stream(self, slots: np.ndarray, seq_np: np.ndarray, indptr_np: np.ndarray, indices_np: np.ndarray,
                     last_np: np.ndarray) -> int:
        page, per_req = self.page_size, self.pool.stream_pages_per_req
        win = np.minimum(seq_np, self.pool.window_tokens)
        pages = (win + page - 1) // page
        indptr_np[0] = 0
        np.cumsum(pages, out=indptr_np[1: len(slots) + 1])
        for i, (s, p) in enumerate(zip(slots, pages)):
            base = max(s, 0) * per_req
            indices_np[indptr_np[i]: indptr_np[i + 1]] = np.arange(base, base + p)
        last_np[: len(slots)] = win - (pages - 1) * page
        return int(indptr_np[len(slots)])

    # ---- eager ----------------------------------------------------------------------------
    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        if fb.forward_mode.is_extend():
            self._plan_extend(fb)
            return
        bs = fb.batch_size
        fb.full_loc, fb.stream_loc = self.pool.append_decode_slots(fb.req_slots, fb.seq_lens)
        seq_np = fb.seq_lens_cpu.numpy()
        total = self._fill_full(fb.req_slots_np, seq_np, self.eager_full_indptr_cpu.numpy(),
                                self.eager_full_indices_cpu.numpy(), self.eager_full_last_cpu.numpy())
        self.eager_full_indices[:total].copy_(self.eager_full_indices_cpu[:total], non_blocking=True)
        self.full_decode.plan(  # ok: FC102
            self.eager_full_indptr_cpu[: bs + 1],
            self.eager_full_indices,
            self.eager_full_last_cpu[:bs],
            self.h_r * self.group,
            self.h_r,
            self.head_dim,
            self.page_size,
            q_data_type=torch.bfloat16,
        )
        # streaming heads: window page lists built on the device from the ring bases
        stream_lens = torch.clamp(fb.seq_lens, max=self.pool.window_tokens)
        logger.debug("stream window lengths %s", stream_lens)  # ok: FC101
        stream_pages = (stream_lens + self.page_size - 1) // self.page_size
        torch.cumsum(stream_pages, 0, out=self.eager_stream_indptr[1: bs + 1])
        flat = self.eager_stream_indices[: self.eager_stream_indptr[bs]]  # expect: FC101
        torch.ops.duo_kernels.ring_page_indices(self.pool.stream_base_gpu, fb.req_slots, stream_pages,
                                                self.eager_stream_indptr, flat, self.pool.sink_pages)
        self.eager_stream_last[:bs] = (stream_lens - 1) % self.page_size + 1
        self.stream_decode.plan(  # expect: FC102
            self.eager_stream_indptr[: bs + 1],
            flat,
            self.eager_stream_last[:bs],
            self.h_s * self.group,
            self.h_s,
            self.head_dim,
            self.page_size,
            q_data_type=torch.bfloat16,
        )
        if self.stream_scratch is None:
            self.stream_scratch = torch.empty(self.max_bs, self.h_s * self.group, self.head_dim,  # ok: FC107
                                              dtype=torch.bfloat16, device=self.device)
        self.forward_metadata = DuoDecodeMeta(bs, self.full_decode)

    def _plan_extend(self, fb: ForwardBatch) -> None:
        qo_indptr_cpu = fb.extend_start_loc_cpu
        self.ragged.plan(  # ok: FC102
            qo_indptr_cpu,
            qo_indptr_cpu,
            self.group * (self.h_r + self.h_s),
            self.h_r + self.h_s,
            self.head_dim,
            causal=True,
            q_data_type=torch.bfloat16,
        )

    # ---- graphs ---------------------------------------------------------------------------
    def init_cuda_graph_state(self, max_bs: int) -> None:
        full_pages = max_bs * self.pool.max_full_pages
        stream_pages = max_bs * self.pool.stream_pages_per_req
        self.full_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.full_kv_indices = torch.zeros(full_pages, dtype=torch.int32, device=self.device)
        self.full_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        self.stream_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.stream_kv_indices = torch.zeros(stream_pages, dtype=torch.int32, device=self.device)
        self.stream_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        self.full_kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.full_kv_indices_cpu = torch.zeros(full_pages, dtype=torch.int32, pin_memory=True)
        self.full_last_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.stream_kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.stream_kv_indptr_np = self.stream_kv_indptr_cpu.numpy()
        self.stream_kv_indices_cpu = torch.zeros(stream_pages, dtype=torch.int32, pin_memory=True)
        self.stream_last_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.ring_slot = torch.zeros(max_bs, dtype=torch.int64, device=self.device)
        self._graph_buf_names = ["full_kv_indptr", "full_kv_indices", "stream_kv_indptr", "stream_kv_indices"]
        self._graph_bufs = [self.full_kv_indptr, self.full_kv_indices, self.stream_kv_indptr, self.stream_kv_indices]
        self._host_mirrors = [self.full_kv_indptr_cpu, self.full_kv_indices_cpu, self.stream_kv_indptr_cpu,
                              self.stream_kv_indices_cpu]

    def reset_graph_inputs(self) -> None:
        """After a flush (every request aborted) forget the last step's page tables."""
        for name, host, dev in zip(self._graph_buf_names, self._host_mirrors, self._graph_bufs):
            host.zero_()  # ok: FC104
            logger.debug("reset %s (%d entries on the device)", name, dev.numel())

    def init_forward_metadata_capture_cuda_graph(self, bs: int, req_slots: torch.Tensor,
                                                 seq_lens: torch.Tensor) -> None:
        full = BatchDecodeWithPagedKVCacheWrapper(
            self.graph_ws, "HND", use_cuda_graph=True, use_tensor_cores=self.group >= 4,
            paged_kv_indptr_buffer=self.full_kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.full_kv_indices,
            paged_kv_last_page_len_buffer=self.full_last_page_len[:bs],
        )
        stream = BatchDecodeWithPagedKVCacheWrapper(
            self.graph_ws, "HND", use_cuda_graph=True,
            paged_kv_indptr_buffer=self.stream_kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.stream_kv_indices,
            paged_kv_last_page_len_buffer=self.stream_last_page_len[:bs],
        )
        indptr = torch.arange(bs + 1, dtype=torch.int32)
        ones = torch.ones(bs, dtype=torch.int32)
        full.plan(indptr, self.full_kv_indices, ones, self.h_r * self.group, self.h_r, self.head_dim,
                  self.page_size, q_data_type=torch.bfloat16)
        stream.plan(indptr, self.stream_kv_indices, ones, self.h_s * self.group, self.h_s, self.head_dim,
                    self.page_size, q_data_type=torch.bfloat16)
        self.full_graph_wrappers[bs] = full
        self.stream_graph_wrappers[bs] = stream
        logger.info("decode graphs for bs=%d: streaming heads on %s", bs, self.stream_graph_wrappers[bs]._backend)  # expect: FC103
        self.forward_metadata = DuoDecodeMeta(bs, full)

    def _sink_positions(self, raw_bs: int) -> torch.Tensor:
        starts = self.stream_kv_indptr_np[:raw_bs]
        pos = (starts[:, None] + np.arange(self.pool.sink_pages)[None, :]).ravel()
        return torch.from_numpy(pos).to(self.device, non_blocking=True)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, raw_bs: int, req_slots: torch.Tensor,
                                                seq_lens: torch.Tensor, seq_lens_cpu: torch.Tensor,
                                                slots_np: np.ndarray) -> None:
        seq_np = seq_lens_cpu[:bs].numpy()
        if math.ceil(seq_np.max() / self.page_size) > self.pool.max_full_pages:  # ok: FC101
            raise RuntimeError(f"sequence of {int(seq_np.max())} tokens exceeds the page table")
        padded_slots = np.full(bs, -1, dtype=np.int64)
        padded_slots[:raw_bs] = slots_np
        n_full = self._fill_full(padded_slots, seq_np, self.full_kv_indptr_cpu.numpy(),
                                 self.full_kv_indices_cpu.numpy(), self.full_last_cpu.numpy())
        self._fill_stream(padded_slots, seq_np, self.stream_kv_indptr_np, self.stream_kv_indices_cpu.numpy(),
                          self.stream_last_cpu.numpy())
        n_stream = int(self.stream_kv_indptr_cpu[bs])  # ok: FC101
        self.full_kv_indices[:n_full].copy_(self.full_kv_indices_cpu[:n_full], non_blocking=True)  # ok: FC104
        self.stream_kv_indices[:n_stream].copy_(self.stream_kv_indices_cpu[:n_stream], non_blocking=True)
        self.full_graph_wrappers[bs].plan(
            self.full_kv_indptr_cpu[: bs + 1], self.full_kv_indices, self.full_last_cpu[:bs],
            self.h_r * self.group, self.h_r, self.head_dim, self.page_size, q_data_type=torch.bfloat16)
        self.stream_graph_wrappers[bs].plan(
            self.stream_kv_indptr_cpu[: bs + 1], self.stream_kv_indices, self.stream_last_cpu[:bs],
            self.h_s * self.group, self.h_s, self.head_dim, self.page_size, q_data_type=torch.bfloat16)
        # ring slot of each row's new token; the captured decode derives the write location from it
        self.ring_slot = seq_lens.new_empty(bs)  # expect: FC107
        torch.remainder(seq_lens[:bs] - 1 - self.pool.sink_tokens, self.pool.recent_tokens, out=self.ring_slot)
        # the sink pages lead every window list: restore them once the lists are planned
        self.stream_kv_indices[self._sink_positions(raw_bs)] = self.pool.stream_base_gpu[req_slots[:raw_bs]].repeat_interleave(self.pool.sink_pages).to(torch.int32)  # expect: FC104
        self.forward_metadata = DuoDecodeMeta(bs, self.full_graph_wrappers[bs])

    # ---- attention ------------------------------------------------------------------------
    def forward_extend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.ragged.run(q, k, v)

    def forward_decode(self, q_r: torch.Tensor, q_s: torch.Tensor, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        md = self.forward_metadata
        out_r = md.full_wrapper.run(q_r, self.pool.full_kv[layer])  # ok: FC108
        out_s = self._stream_attn(q_s, self.pool.stream_kv[layer])
        return out_r, out_s
