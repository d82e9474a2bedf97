"""Per-step data handed between the scheduler, the model runner and the output processor."""

import enum
from dataclasses import dataclass, field
from typing import List, Optional

import torch


class ForwardMode(enum.IntEnum):
    EXTEND = 1
    DECODE = 2

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    min_new_tokens: int = 0
    max_new_tokens: int = 256
    stop_token_ids: List[int] = field(default_factory=list)
    stop: List[str] = field(default_factory=list)
    logprobs: bool = False
    top_logprobs: int = 0


@dataclass
class SchedulerOutput:
    """What the scheduler decided for one step; host data only."""

    forward_mode: ForwardMode
    req_ids: List[str]
    req_pool_indices: List[int]
    input_ids: List[int]  # negative ids refer to rows of the previous step's sampled tokens
    seq_lens: List[int]
    prefix_lens: List[int]
    out_cache_loc: List[int]
    sampling_params: List[SamplingParams]
    output_lens: List[int]
    has_placeholders: bool = False


MAX_STOP_IDS = 8


@dataclass
class SamplingBatchInfo:
    temperatures: torch.Tensor
    top_ps: torch.Tensor
    top_ks: torch.Tensor
    top_ks_cpu: torch.Tensor
    presence_penalties: torch.Tensor
    frequency_penalties: torch.Tensor
    repetition_penalties: torch.Tensor
    no_repeat_ngram_sizes: torch.Tensor
    no_repeat_ngram_sizes_cpu: torch.Tensor
    min_new_tokens: torch.Tensor
    output_lens: torch.Tensor
    stop_token_ids: torch.Tensor  # [bs, MAX_STOP_IDS], -1 padded
    req_slots: torch.Tensor
    all_greedy: bool
    has_penalties: bool
    return_top_logprobs: bool

    @classmethod
    def build(cls, params, output_lens, req_slots, vocab_size, device):
        def upload(values, dtype):
            return torch.tensor(values, dtype=dtype, pin_memory=True).to(device, non_blocking=True)

        temps = [p.temperature for p in params]
        top_ks = [p.top_k if p.top_k > 0 else vocab_size for p in params]
        ngram = [p.no_repeat_ngram_size for p in params]
        stop_rows = [(p.stop_token_ids[:MAX_STOP_IDS] + [-1] * MAX_STOP_IDS)[:MAX_STOP_IDS] for p in params]
        return cls(
            temperatures=upload([max(t, 1e-5) for t in temps], torch.float32)[:, None],
            top_ps=upload([p.top_p for p in params], torch.float32),
            top_ks=upload(top_ks, torch.int64),
            top_ks_cpu=torch.tensor(top_ks, dtype=torch.int64),
            presence_penalties=upload([p.presence_penalty for p in params], torch.float32),
            frequency_penalties=upload([p.frequency_penalty for p in params], torch.float32),
            repetition_penalties=upload([p.repetition_penalty for p in params], torch.float32),
            no_repeat_ngram_sizes=upload(ngram, torch.int64),
            no_repeat_ngram_sizes_cpu=torch.tensor(ngram, dtype=torch.int64),
            min_new_tokens=upload([p.min_new_tokens for p in params], torch.int64),
            output_lens=upload(output_lens, torch.int64),
            stop_token_ids=upload(stop_rows, torch.int64),
            req_slots=upload(req_slots, torch.int64),
            all_greedy=all(t == 0 for t in temps),
            has_penalties=any(p.presence_penalty or p.frequency_penalty or p.repetition_penalty != 1.0 for p in params),
            return_top_logprobs=any(p.top_logprobs > 0 for p in params),
        )


@dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    req_pool_indices: torch.Tensor
    req_pool_indices_cpu: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    seq_lens_sum: int
    out_cache_loc: torch.Tensor
    extend_seq_lens: Optional[torch.Tensor] = None
    extend_seq_lens_cpu: Optional[List[int]] = None
    extend_prefix_lens: Optional[torch.Tensor] = None
    extend_prefix_lens_cpu: Optional[List[int]] = None
    logits_indices: Optional[torch.Tensor] = None
    sampling: Optional[SamplingBatchInfo] = None
    use_cuda_graph: bool = False


@dataclass
class ModelRunnerOutput:
    req_ids: List[str]
    next_token_ids: torch.Tensor  # on the device; the next step reads it for in-flight decodes
    next_token_ids_cpu: torch.Tensor  # pinned; valid once copy_done has completed
    copy_done: torch.cuda.Event
    next_token_logprobs: Optional[torch.Tensor] = None
    topk_ids: Optional[torch.Tensor] = None
    topk_logprobs: Optional[torch.Tensor] = None
