"""Attention state shared by the backends: graph-capture bookkeeping and per-step hooks."""

from __future__ import annotations

import abc
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Dict, List

if TYPE_CHECKING:
    from aphrodite.worker.model_runner import ModelRunner


class CommonAttentionState(abc.ABC):
    def __init__(self, runner: "ModelRunner"):
        self.runner = runner
        self._is_graph_capturing = False

    @contextmanager
    def graph_capture(self, max_batch_size: int):
        self._is_graph_capturing = True
        try:
            yield
        finally:
            self._is_graph_capturing = False

    @abc.abstractmethod
    def graph_capture_get_metadata_for_batch(self, batch_size: int, is_encoder_decoder_model: bool = False):
        """Metadata of a dummy decode batch of ``batch_size`` for capture."""

    def get_graph_input_buffers(self, attn_metadata, is_encoder_decoder_model: bool = False) -> Dict[str, Any]:
        return {"slot_mapping": attn_metadata.slot_mapping}

    def prepare_graph_input_buffers(self, input_buffers, attn_metadata, is_encoder_decoder_model: bool = False) -> None:
        n = attn_metadata.num_decode_tokens
        input_buffers["slot_mapping"][:n].copy_(attn_metadata.slot_mapping, non_blocking=True)  # ok: FC104

    def begin_forward(self, model_input) -> None:
        """Called once per step before the model runs."""


class WindowCompatMixin:
    """FlashInfer before 0.2.5 read the sliding window from the wrapper at run() time."""

    def apply_window(self, wrapper, window_left: int) -> None:
        if window_left >= 0:
            wrapper._window_left = window_left  # expect: FC103


class CommonMetadataBuilder:
    """Accumulates the per-sequence lists of one step; backends turn them into tensors in ``build``."""

    def __init__(self, input_builder):
        self.input_builder = input_builder
        self.runner = input_builder.runner
        self.page_size = self.runner.block_size
        self.prepare()

    def prepare(self) -> None:
        self.slot_mapping: List[int] = []
        self.prefill_seq_lens: List[int] = []
        self.decode_seq_lens: List[int] = []
        self.block_tables: List[List[int]] = []
        self.paged_kv_indices: List[int] = []
        self.paged_kv_indptr: List[int] = [0]
        self.paged_kv_last_page_len: List[int] = []
        self.num_prefills = 0
        self.num_prefill_tokens = 0
        self.num_decode_tokens = 0

    def _add_seq_group(self, inter_data) -> None:
        rows = zip(inter_data.seq_lens, inter_data.query_lens, inter_data.block_tables, inter_data.slots)
        for seq_len, query_len, block_table, slots in rows:
            num_pages = -(-seq_len // self.page_size)
            assert len(block_table) >= num_pages, "block table shorter than the sequence"  # ok: FC109
            if inter_data.is_prompt:
                self.num_prefills += 1
                self.num_prefill_tokens += query_len
                self.prefill_seq_lens.append(seq_len)
            else:
                self.num_decode_tokens += query_len
                self.decode_seq_lens.append(seq_len)
            self.slot_mapping.extend(slots)
            self.block_tables.append(block_table)
            self.paged_kv_indices.extend(block_table[:num_pages])
            self.paged_kv_indptr.append(self.paged_kv_indptr[-1] + num_pages)
            self.paged_kv_last_page_len.append((seq_len - 1) % self.page_size + 1)

    def build(self, seq_lens: List[int], query_lens: List[int], cuda_graph_pad_size: int, batch_size: int):
        for inter_data in self.input_builder.inter_data_list:
            self._add_seq_group(inter_data)
        if cuda_graph_pad_size > 0:
            # padded graph rows: one token on page 0 each
            for _ in range(cuda_graph_pad_size):
                self.slot_mapping.append(-1)
                self.decode_seq_lens.append(1)
                self.block_tables.append([0])
                self.paged_kv_indices.append(0)
                self.paged_kv_indptr.append(self.paged_kv_indptr[-1] + 1)
                self.paged_kv_last_page_len.append(1)
            self.num_decode_tokens += cuda_graph_pad_size
