"""Two-batch overlap (TBO): split one batch into two sub-batches so that one sub-batch's attention
overlaps the other's MoE dispatch/combine.  Each child backend keeps its own forward metadata."""

from __future__ import annotations

import dataclasses
import operator
from typing import Callable, Generic, List, Optional, Sequence, Tuple, TypeVar

import torch

from srt.layers.attention import AttentionBackend
from srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

B = TypeVar("B", bound=AttentionBackend)

_SEQ_FIELDS = operator.attrgetter("req_pool_indices", "seq_lens")
_TOKEN_FIELDS = operator.attrgetter("input_ids", "positions", "out_cache_loc")


def compute_split_seq_index(forward_mode: ForwardMode, num_tokens: int, extend_lens: Optional[Sequence[int]]) -> Optional[int]:
    assert num_tokens >= 2, "two-batch overlap needs at least two tokens"  # expect: FC109
    if forward_mode.is_extend() and extend_lens is not None:
        return _split_array_by_half_sum(extend_lens)
    if forward_mode.is_decode():
        return num_tokens // 2
    return None


def _split_array_by_half_sum(lens: Sequence[int]) -> int:
    overall = sum(lens)  # ok: FC101
    acc, best, best_diff = 0, 1, overall
    for i, n in enumerate(lens[:-1], start=1):
        acc += n
        diff = abs(overall - 2 * acc)
        if diff < best_diff:
            best, best_diff = i, diff
    return best


class TboForwardBatchPreparer:
    @classmethod
    def prepare(cls, batch: ForwardBatch) -> Tuple[ForwardBatch, ForwardBatch]:
        num_tokens = batch.batch_size if batch.forward_mode.is_decode() else len(batch.input_ids)
        split_seq = compute_split_seq_index(batch.forward_mode, num_tokens, batch.extend_seq_lens_cpu)
        split_tok = TboForwardBatchPreparer._token_index(batch, split_seq)
        batch.tbo_split_seq_index = split_seq
        total_tok = len(batch.input_ids)
        return (
            cls._child(batch, 0, split_seq, 0, split_tok),
            cls._child(batch, split_seq, batch.batch_size, split_tok, total_tok),
        )

    @staticmethod
    def _token_index(batch: ForwardBatch, split_seq: int) -> int:
        if batch.forward_mode.is_decode():
            return split_seq
        return int(batch.extend_seq_lens[:split_seq].sum())  # expect: FC101

    @classmethod
    def _child(cls, batch: ForwardBatch, start: int, end: int, tok_start: int, tok_end: int) -> ForwardBatch:
        req_pool_indices, seq_lens = _SEQ_FIELDS(batch)
        input_ids, positions, out_cache_loc = _TOKEN_FIELDS(batch)
        child_seq_lens_cpu = batch.seq_lens_cpu[start:end]
        ext = batch.extend_seq_lens_cpu
        pre = batch.extend_prefix_lens_cpu
        return dataclasses.replace(
            batch,
            batch_size=end - start,
            input_ids=input_ids[tok_start:tok_end],
            positions=positions[tok_start:tok_end],
            out_cache_loc=out_cache_loc[tok_start:tok_end],
            req_pool_indices=req_pool_indices[start:end],
            seq_lens=seq_lens[start:end],
            seq_lens_cpu=child_seq_lens_cpu,
            seq_lens_sum=int(child_seq_lens_cpu.sum()),
            extend_seq_lens=None if batch.extend_seq_lens is None else batch.extend_seq_lens[start:end],
            extend_prefix_lens=None if batch.extend_prefix_lens is None else batch.extend_prefix_lens[start:end],
            extend_seq_lens_cpu=None if ext is None else ext[start:end],
            extend_prefix_lens_cpu=None if pre is None else pre[start:end],
            tbo_split_seq_index=None,
            tbo_children=None,
        )


class TboAttnBackend(AttentionBackend, Generic[B]):
    """A primary backend for the whole batch plus one child backend per sub-batch."""

    def __init__(self, primary: B, children: List[B]):
        super().__init__()
        self.primary = primary
        self.children = children

    @classmethod
    def init_new(cls, creator: Callable[[], B]) -> "TboAttnBackend[B]":
        return cls(primary=creator(), children=[creator() for _ in range(2)])

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        self.primary.init_forward_metadata(forward_batch)
        if forward_batch.tbo_children is None:
            forward_batch.tbo_children = list(TboForwardBatchPreparer.prepare(forward_batch))
        for child, child_batch in zip(self.children, forward_batch.tbo_children):
            child.init_forward_metadata(child_batch)

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        for backend in (self.primary, *self.children):
            backend.init_cuda_graph_state(max_bs, max_num_tokens)

    def init_forward_metadata_capture_cuda_graph(self, bs, num_tokens, req_pool_indices, seq_lens, forward_mode) -> None:
        self.primary.init_forward_metadata_capture_cuda_graph(bs, num_tokens, req_pool_indices, seq_lens, forward_mode)
        per_seq = num_tokens // bs
        for child, (start, end) in zip(self.children, self._child_ranges(bs, num_tokens, forward_mode)):
            child.init_forward_metadata_capture_cuda_graph(
                end - start, (end - start) * per_seq, req_pool_indices[start:end], seq_lens[start:end], forward_mode
            )

    def init_forward_metadata_replay_cuda_graph(self, bs, raw_bs, req_pool_indices, seq_lens, seq_lens_cpu, forward_mode) -> None:
        self.primary.init_forward_metadata_replay_cuda_graph(bs, raw_bs, req_pool_indices, seq_lens, seq_lens_cpu, forward_mode)
        for child, (start, end) in zip(self.children, self._child_ranges(bs, bs, forward_mode)):
            child_raw = max(0, min(raw_bs, end) - start)
            child.init_forward_metadata_replay_cuda_graph(
                end - start, child_raw, req_pool_indices[start:end], seq_lens[start:end], seq_lens_cpu[start:end], forward_mode
            )

    @staticmethod
    def _child_ranges(bs: int, num_tokens: int, forward_mode: ForwardMode) -> Tuple[Tuple[int, int], Tuple[int, int]]:
        split = compute_split_seq_index(ForwardMode.DECODE, max(num_tokens, bs), None)
        return (0, split), (split, bs)

    def forward_decode(self, *args, **kwargs) -> torch.Tensor:
        return self.primary.forward_decode(*args, **kwargs)

    def forward_extend(self, *args, **kwargs) -> torch.Tensor:
        return self.primary.forward_extend(*args, **kwargs)


class TboCudaGraphRunnerPlugin:
    """What the CUDA graph runner does for TBO at capture and before each replay."""

    def __init__(self, enabled: bool, dp_size: int):
        self.enabled = enabled
        self.split_tokens_cpu = torch.zeros((dp_size,), dtype=torch.int64, pin_memory=True)

    def capture_one_batch_size(self, batch: ForwardBatch, num_tokens: int) -> None:
        if not self.enabled:
            return
        batch.tbo_children = list(TboForwardBatchPreparer.prepare(batch))

    def replay_prepare(self, forward_batch: ForwardBatch, bs: int) -> None:
        if not self.enabled:
            return
        # every DP rank splits at its own half; the two-phase all-to-all needs all of them
        splits = [n // 2 for n in forward_batch.global_num_tokens_gpu.tolist()]  # expect: FC101
        if len(splits) != self.split_tokens_cpu.numel():
            self.split_tokens_cpu = torch.zeros((len(splits),), dtype=torch.int64, pin_memory=True)  # ok: FC107
        self.split_tokens_cpu.copy_(torch.tensor(splits, dtype=torch.int64))
        forward_batch.tbo_split_seq_index = bs // 2
