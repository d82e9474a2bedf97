"""GPU model runner: persistent input buffers, the FlashInfer builder, graph dispatch and async output."""

from __future__ import annotations

import gc
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import torch

from vfd.attention.backends.flashinfer import FlashInferMetadataBuilder, cdiv
from vfd.attention.backends.utils import CommonAttentionMetadata
from vfd.compilation.cuda_graph import CUDAGraphWrapper
from vfd.config import CUDAGraphMode, VllmConfig
from vfd.cudagraph_dispatcher import CudagraphDispatcher
from vfd.forward_context import BatchDescriptor, set_forward_context
from vfd.model_executor.toy_llama import ToyLlamaForCausalLM

logger = logging.getLogger(__name__)


@dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: list[int]
    block_ids: list[int]
    num_computed_tokens: int = 0


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list[NewRequestData]
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    finished_req_ids: set[str] = field(default_factory=set)
    offloaded_block_ids: list[int] = field(default_factory=list)


@dataclass
class ModelRunnerOutput:
    req_ids: list[str]
    sampled_token_ids: list[list[int]]


class KVOffloadConnector:
    """Copies the blocks of finished requests to host memory on a side stream."""

    def __init__(self):
        self.stream = torch.cuda.Stream()
        self.pending: list[torch.Tensor] = []

    def save_blocks(self, block_ids: torch.Tensor) -> None:
        self.pending.append(block_ids)


class AsyncModelRunnerOutput:
    """Holds the sampled ids while their device-to-host copy runs; ``get_output`` runs in the output thread."""

    def __init__(self, model_runner_output: ModelRunnerOutput, sampled_token_ids: torch.Tensor, copy_stream):
        self._model_runner_output = model_runner_output
        self._sampled_token_ids = sampled_token_ids
        self._async_copy_ready_event = torch.cuda.Event()
        default_stream = torch.cuda.current_stream()
        with torch.cuda.stream(copy_stream):
            copy_stream.wait_stream(default_stream)
            self._sampled_token_ids_cpu = self._sampled_token_ids.to("cpu", non_blocking=True)
            self._async_copy_ready_event.record()

    def get_output(self) -> ModelRunnerOutput:
        self._async_copy_ready_event.synchronize()  # ok: FC101
        valid_sampled_token_ids = self._sampled_token_ids_cpu.tolist()  # ok: FC101
        output = self._model_runner_output
        output.sampled_token_ids = valid_sampled_token_ids
        return output


class GPUModelRunner:
    def __init__(self, vllm_config: VllmConfig, device: torch.device):
        self.vllm_config = vllm_config
        self.device = device
        self.compilation_config = vllm_config.compilation_config
        self.max_num_reqs = vllm_config.scheduler_config.max_num_seqs
        self.max_num_tokens = vllm_config.scheduler_config.max_num_batched_tokens
        self.max_model_len = vllm_config.model_config.max_model_len
        self.block_size = vllm_config.cache_config.block_size
        self.use_async_scheduling = vllm_config.scheduler_config.async_scheduling
        self.eos_token_id = 2
        max_blocks = cdiv(self.max_model_len, self.block_size)

        self.input_ids = torch.zeros(self.max_num_tokens, dtype=torch.int32, device=device)
        self.positions = torch.zeros(self.max_num_tokens, dtype=torch.int64, device=device)
        self.slot_mapping = torch.zeros(self.max_num_tokens, dtype=torch.int64, device=device)
        self.block_table = torch.zeros((self.max_num_reqs, max_blocks), dtype=torch.int32, device=device)
        self.block_table_cpu = torch.zeros((self.max_num_reqs, max_blocks), dtype=torch.int32, pin_memory=True)
        self.block_table_np = self.block_table_cpu.numpy()
        self.query_start_loc = torch.zeros(self.max_num_reqs + 1, dtype=torch.int32, device=device)
        self.query_start_loc_cpu = torch.zeros(self.max_num_reqs + 1, dtype=torch.int32, pin_memory=True)
        self.query_start_loc_np = self.query_start_loc_cpu.numpy()
        self.seq_lens = torch.zeros(self.max_num_reqs, dtype=torch.int32, device=device)
        self.seq_lens_cpu = torch.zeros(self.max_num_reqs, dtype=torch.int32, pin_memory=True)
        self.seq_lens_np = self.seq_lens_cpu.numpy()
        self.sampled_token_ids_cpu = torch.zeros((self.max_num_reqs, 1), dtype=torch.int64, pin_memory=True)
        self.async_output_copy_stream = torch.cuda.Stream() if self.use_async_scheduling else None

        self.req_ids: list[str] = []
        self.num_computed_tokens_np = np.zeros(self.max_num_reqs, dtype=np.int32)
        self.discard_mask_cpu = torch.zeros(self.max_num_reqs, dtype=torch.bool)

        self.model = ToyLlamaForCausalLM(vllm_config).to(device)
        self.model_cg = CUDAGraphWrapper(self.model, vllm_config, CUDAGraphMode.FULL)
        layer_names = self.model.attention_layer_names()
        self.attn_metadata_builder = FlashInferMetadataBuilder(None, layer_names, vllm_config, device)
        self.cudagraph_dispatcher = CudagraphDispatcher(vllm_config)
        self.kv_connector = KVOffloadConnector()
        self.cudagraph_batch_sizes = sorted(self.compilation_config.cudagraph_capture_sizes)

    # ---- per-step --------------------------------------------------------------------------------------------

    def _stage_block_ids_for_offload(self, block_ids: list[int]) -> None:
        n = len(block_ids)
        staging = self.attn_metadata_builder.paged_kv_indices[-n:]
        staging.copy_(torch.tensor(block_ids, dtype=torch.int32), non_blocking=True)  # expect: FC104
        self.kv_connector.save_blocks(staging)

    def _update_states(self, scheduler_output: SchedulerOutput) -> None:
        for req_id in scheduler_output.finished_req_ids:
            if req_id in self.req_ids:
                self.req_ids.remove(req_id)
        if scheduler_output.offloaded_block_ids:
            self._stage_block_ids_for_offload(scheduler_output.offloaded_block_ids)
        for new_req in scheduler_output.scheduled_new_reqs:
            row = len(self.req_ids)
            self.req_ids.append(new_req.req_id)
            self.block_table_np[row, : len(new_req.block_ids)] = new_req.block_ids
            self.num_computed_tokens_np[row] = new_req.num_computed_tokens
        num_reqs = len(self.req_ids)
        self.discard_mask_cpu = torch.zeros(num_reqs, dtype=torch.bool)  # ok: FC107

    def _prepare_inputs(self, scheduler_output: SchedulerOutput) -> tuple[CommonAttentionMetadata, BatchDescriptor]:
        total_num_scheduled_tokens = scheduler_output.total_num_scheduled_tokens
        assert total_num_scheduled_tokens > 0  # expect: FC109
        num_reqs = len(self.req_ids)
        num_scheduled_tokens = np.array(
            [scheduler_output.num_scheduled_tokens[r] for r in self.req_ids], dtype=np.int32
        )
        max_num_scheduled_tokens = int(num_scheduled_tokens.max())

        self.query_start_loc_np[0] = 0
        np.cumsum(num_scheduled_tokens, out=self.query_start_loc_np[1 : num_reqs + 1])
        self.seq_lens_np[:num_reqs] = self.num_computed_tokens_np[:num_reqs] + num_scheduled_tokens
        if (self.seq_lens_np[:num_reqs] > self.max_model_len).any():  # ok: FC101
            raise ValueError(f"a request exceeds max_model_len={self.max_model_len}")

        self.query_start_loc[: num_reqs + 1].copy_(self.query_start_loc_cpu[: num_reqs + 1], non_blocking=True)
        self.seq_lens[:num_reqs].copy_(self.seq_lens_cpu[:num_reqs], non_blocking=True)
        self.block_table[:num_reqs].copy_(self.block_table_cpu[:num_reqs], non_blocking=True)

        common = CommonAttentionMetadata(
            query_start_loc=self.query_start_loc[: num_reqs + 1],
            query_start_loc_cpu=self.query_start_loc_cpu[: num_reqs + 1],
            seq_lens=self.seq_lens[:num_reqs],
            seq_lens_cpu=self.seq_lens_cpu[:num_reqs],
            num_reqs=num_reqs,
            num_actual_tokens=total_num_scheduled_tokens,
            max_query_len=max_num_scheduled_tokens,
            block_table_tensor=self.block_table[:num_reqs],
            slot_mapping=self.slot_mapping[:total_num_scheduled_tokens],
        )
        uniform_decode = max_num_scheduled_tokens == 1 and total_num_scheduled_tokens == num_reqs
        return common, BatchDescriptor(num_tokens=total_num_scheduled_tokens, uniform_decode=uniform_decode)

    @torch.inference_mode()
    def execute_model(self, scheduler_output: SchedulerOutput):
        self._update_states(scheduler_output)
        common, batch_descriptor = self._prepare_inputs(scheduler_output)
        num_reqs = common.num_reqs
        num_tokens = common.num_actual_tokens
        runtime_mode, batch_descriptor = self.cudagraph_dispatcher.dispatch(batch_descriptor)
        attn_metadata = self.attn_metadata_builder.build(common_prefix_len=0, common_attn_metadata=common)

        with set_forward_context(attn_metadata, self.vllm_config, runtime_mode, batch_descriptor):
            hidden_states = self.model_cg(self.input_ids[:num_tokens], self.positions[:num_tokens])
        logits_indices = common.query_start_loc[1:] - 1
        logits = self.model.compute_logits(hidden_states[logits_indices])
        sampled_token_ids = logits.argmax(dim=-1, keepdim=True)

        output = ModelRunnerOutput(req_ids=list(self.req_ids), sampled_token_ids=[])
        if self.use_async_scheduling:
            return AsyncModelRunnerOutput(output, sampled_token_ids, self.async_output_copy_stream)

        self.sampled_token_ids_cpu[:num_reqs].copy_(sampled_token_ids, non_blocking=True)
        output.sampled_token_ids = self.sampled_token_ids_cpu[:num_reqs].tolist()  # expect: FC101
        return output

    # ---- start-up --------------------------------------------------------------------------------------------

    def _dummy_run(self, num_tokens: int, runtime_mode: CUDAGraphMode, uniform_decode: bool = True):
        assert num_tokens <= self.max_num_tokens  # ok: FC109
        num_reqs = min(num_tokens, self.max_num_reqs)
        self.seq_lens[:num_reqs].fill_(1)
        self.seq_lens_cpu[:num_reqs].copy_(self.seq_lens[:num_reqs])  # expect: FC101
        self.query_start_loc_np[: num_reqs + 1] = np.arange(num_reqs + 1)
        self.query_start_loc[: num_reqs + 1].copy_(self.query_start_loc_cpu[: num_reqs + 1], non_blocking=True)
        common = CommonAttentionMetadata(
            query_start_loc=self.query_start_loc[: num_reqs + 1],
            query_start_loc_cpu=self.query_start_loc_cpu[: num_reqs + 1],
            seq_lens=self.seq_lens[:num_reqs],
            seq_lens_cpu=self.seq_lens_cpu[:num_reqs],
            num_reqs=num_reqs,
            num_actual_tokens=num_tokens,
            max_query_len=1,
            block_table_tensor=self.block_table[:num_reqs],
            slot_mapping=self.slot_mapping[:num_tokens],
        )
        attn_metadata = None
        if runtime_mode == CUDAGraphMode.FULL:
            attn_metadata = self.attn_metadata_builder.build_for_cudagraph_capture(common)
        batch_descriptor = BatchDescriptor(num_tokens=num_tokens, uniform_decode=uniform_decode)
        with set_forward_context(attn_metadata, self.vllm_config, runtime_mode, batch_descriptor):
            return self.model_cg(self.input_ids[:num_tokens], self.positions[:num_tokens])

    def capture_model(self) -> float:
        mode = self.compilation_config.cudagraph_mode
        self.cudagraph_dispatcher.initialize_cudagraph_keys(mode, uniform_decode_query_len=1)
        start = time.perf_counter()
        start_free = torch.cuda.mem_get_info()[0]
        gc.collect()
        for num_tokens in reversed(self.cudagraph_batch_sizes):
            for _ in range(self.compilation_config.cudagraph_num_of_warmups):
                self._dummy_run(num_tokens, CUDAGraphMode.NONE)
            self._dummy_run(num_tokens, CUDAGraphMode.FULL)
        torch.cuda.synchronize()  # ok: FC101
        used = (start_free - torch.cuda.mem_get_info()[0]) / (1 << 30)
        logger.info("captured %d graphs in %.1f s, %.2f GiB", len(self.cudagraph_batch_sizes), time.perf_counter() - start, used)
        return used
