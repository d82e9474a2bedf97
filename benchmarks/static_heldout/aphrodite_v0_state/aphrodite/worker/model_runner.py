"""GPU model runner: input preparation, decode graph capture per batch size and the per-step execute."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch

from aphrodite.attention import FlashInferMetadata, FlashInferMetadataBuilder, FlashInferState
from aphrodite.common.timing import nvtx_range, phase_timer, step_timer

_BATCH_SIZES_TO_CAPTURE = [1, 2, 4] + [8 * i for i in range(1, 33)]


@dataclass
class ModelInputForGPU:
    input_tokens: torch.Tensor
    input_positions: torch.Tensor
    attn_metadata: FlashInferMetadata
    use_cuda_graph: bool = False
    graph_batch_size: int = 0


@dataclass
class SamplerOutput:
    sampled_token_ids: torch.Tensor
    logprobs: torch.Tensor


@dataclass
class InputBuilder:
    runner: "ModelRunner"
    inter_data_list: list = field(default_factory=list)


class CUDAGraphRunner(torch.nn.Module):
    def __init__(self, model: torch.nn.Module, attn_state: FlashInferState):
        super().__init__()
        self.model = model
        self.attn_state = attn_state
        self.graph: Optional[torch.cuda.CUDAGraph] = None
        self.input_buffers: Dict[str, torch.Tensor] = {}
        self.output_buffers: Dict[str, torch.Tensor] = {}

    def capture(self, input_ids, positions, kv_caches, attn_metadata, memory_pool, stream) -> None:
        for _ in range(2):
            self.model(input_ids=input_ids, positions=positions, kv_caches=kv_caches, attn_metadata=attn_metadata)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=memory_pool, stream=stream):
            hidden = self.model(input_ids=input_ids, positions=positions, kv_caches=kv_caches, attn_metadata=attn_metadata)
            if torch.isnan(hidden).any():  # expect: FC101
                raise RuntimeError("NaN in a captured decode batch")
        self.input_buffers = {
            "input_ids": input_ids,
            "positions": positions,
            **self.attn_state.get_graph_input_buffers(attn_metadata),
        }
        self.output_buffers = {"hidden_states": hidden}

    @nvtx_range("graph_replay")
    def forward(self, input_ids, positions, kv_caches, attn_metadata, **kwargs) -> torch.Tensor:
        self.input_buffers["input_ids"].copy_(input_ids, non_blocking=True)
        self.input_buffers["positions"].copy_(positions, non_blocking=True)
        self.attn_state.prepare_graph_input_buffers(self.input_buffers, attn_metadata)
        self.graph.replay()
        return self.output_buffers["hidden_states"]


class ModelRunner:
    def __init__(self, model_config, scheduler_config, device: torch.device, block_size: int, max_blocks_per_seq: int,
                 pipeline_parallel_size: int = 1, use_trtllm_decode: bool = False):
        self.model_config = model_config
        self.scheduler_config = scheduler_config
        self.device = device
        self.block_size = block_size
        self.max_blocks_per_seq = max_blocks_per_seq
        self.use_trtllm_decode = use_trtllm_decode
        self.model: Optional[torch.nn.Module] = None
        self.attn_state = FlashInferState(self)
        self.input_builder = InputBuilder(self)
        self.attn_builder = FlashInferMetadataBuilder(self.input_builder)
        self.graph_runners: List[Dict[int, CUDAGraphRunner]] = [{} for _ in range(pipeline_parallel_size)]
        self.graph_memory_pool = None
        self._capture_stream = torch.cuda.Stream()
        self.sampled_host = torch.empty(scheduler_config.max_num_seqs, dtype=torch.int64, pin_memory=True)

    @phase_timer("load_model")
    def load_model(self, model: torch.nn.Module) -> None:
        self.model = model.to(self.device).eval()

    @phase_timer("capture_model")
    @torch.inference_mode()
    def capture_model(self, kv_caches: List[List[torch.Tensor]]) -> None:
        max_bs = _BATCH_SIZES_TO_CAPTURE[-1]
        input_tokens = torch.zeros(max_bs, dtype=torch.long, device=self.device)
        input_positions = torch.zeros(max_bs, dtype=torch.long, device=self.device)
        with self.attn_state.graph_capture(max_bs):
            for virtual_engine, graphs in enumerate(self.graph_runners):
                for bs in reversed(_BATCH_SIZES_TO_CAPTURE):
                    attn_metadata = self.attn_state.graph_capture_get_metadata_for_batch(bs)
                    runner = CUDAGraphRunner(self.model, self.attn_state)
                    runner.capture(input_tokens[:bs], input_positions[:bs], kv_caches[virtual_engine], attn_metadata,
                                   self.graph_memory_pool, self._capture_stream)
                    self.graph_memory_pool = runner.graph.pool()
                    graphs[bs] = runner

    def graph_batch_size(self, n: int) -> int:
        return next((bs for bs in _BATCH_SIZES_TO_CAPTURE if bs >= n), -1)

    def prepare_model_input(self, seq_group_metadata_list: list) -> ModelInputForGPU:
        self.attn_builder.prepare()
        self.input_builder.inter_data_list = [sg.inter_data for sg in seq_group_metadata_list]
        tokens: List[int] = []
        positions: List[int] = []
        seq_lens: List[int] = []
        query_lens: List[int] = []
        for sg in seq_group_metadata_list:
            tokens.extend(sg.new_token_ids)
            positions.extend(range(sg.context_len, sg.seq_len))
            seq_lens.append(sg.seq_len)
            query_lens.append(sg.seq_len - sg.context_len)
        decode_only = not any(sg.is_prompt for sg in seq_group_metadata_list)
        n = len(seq_group_metadata_list)
        graph_bs = self.graph_batch_size(n) if decode_only else -1
        pad = graph_bs - n if graph_bs > 0 else -1
        attn_metadata = self.attn_builder.build(seq_lens, query_lens, pad, n)
        padded = max(pad, 0)
        ids = torch.tensor(tokens + [0] * padded, dtype=torch.long, pin_memory=True)
        pos = torch.tensor(positions + [0] * padded, dtype=torch.long, pin_memory=True)
        return ModelInputForGPU(
            input_tokens=ids.to(self.device, non_blocking=True),
            input_positions=pos.to(self.device, non_blocking=True),
            attn_metadata=attn_metadata,
            use_cuda_graph=graph_bs > 0,
            graph_batch_size=graph_bs,
        )

    @step_timer("execute_model")
    @torch.inference_mode()
    def execute_model(self, model_input: ModelInputForGPU, kv_caches: List[List[torch.Tensor]],
                      virtual_engine: int = 0) -> SamplerOutput:
        self.attn_state.begin_forward(model_input)
        if model_input.use_cuda_graph:
            model_executable = self.graph_runners[virtual_engine][model_input.graph_batch_size]
        else:
            model_executable = self.model
        hidden = model_executable(
            input_ids=model_input.input_tokens,
            positions=model_input.input_positions,
            kv_caches=kv_caches[virtual_engine],
            attn_metadata=model_input.attn_metadata,
        )
        logprobs = torch.log_softmax(self.model.compute_logits(hidden).float(), dim=-1)
        next_tokens = torch.argmax(logprobs, dim=-1)
        n = next_tokens.numel()
        if self.sampled_host.numel() < n:
            self.sampled_host = torch.empty(2 * n, dtype=torch.int64, pin_memory=True)  # ok: FC107
        return SamplerOutput(sampled_token_ids=next_tokens, logprobs=logprobs.gather(-1, next_tokens[:, None]))
