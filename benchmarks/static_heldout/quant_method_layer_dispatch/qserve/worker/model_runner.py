"""GPU model runner: persistent inputs, the per-step forward and the decode CUDA graphs."""

from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass, field
from typing import Iterable, Optional

import numpy as np
import torch
from torch import nn

from qserve.attention.backends.common import AttentionMetadataBuilder, CommonAttentionMetadata
from qserve.attention.backends.flashinfer import get_kv_cache_layout
from qserve.attention.layer import get_attn_backend
from qserve.config import EngineConfig, ModelConfig
from qserve.layers.linear import get_tensor_model_parallel_world_size
from qserve.layers.quantization import get_quantization_config
from qserve.layers.quantization.base_config import QuantizationConfig, QuantizeMethodBase
from qserve.layers.sampler import Sampler, SamplingMetadata
from qserve.models.llama import LlamaForCausalLM

logger = logging.getLogger(__name__)

_MODEL_REGISTRY: dict[str, type[nn.Module]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
}


@dataclass
class ScheduledBatch:
    """One scheduler step; decode requests come first."""

    req_ids: list[str]
    num_decodes: int
    num_prefills: int
    token_ids: np.ndarray
    positions: np.ndarray
    query_lens: np.ndarray
    seq_lens: np.ndarray
    block_table: np.ndarray
    slot_mapping: np.ndarray
    sampling_metadata: SamplingMetadata
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)

    @property
    def num_reqs(self) -> int:
        return self.num_decodes + self.num_prefills


@dataclass
class ModelRunnerOutput:
    req_ids: list[str]
    # Pinned; valid once ``ready`` has completed.
    sampled_token_ids_cpu: torch.Tensor
    ready: torch.cuda.Event


class CUDAGraphRunner:
    """A decode graph for one batch size; it reads the runner's persistent inputs by address."""

    def __init__(self, model: nn.Module, builder: AttentionMetadataBuilder, input_ids: torch.Tensor,
                 positions: torch.Tensor, batch_size: int, pool) -> None:
        self.model = model
        self.builder = builder
        self.input_ids = input_ids
        self.positions = positions
        self.batch_size = batch_size
        self.pool = pool
        self.graph: Optional[torch.cuda.CUDAGraph] = None
        self.output: Optional[torch.Tensor] = None

    def capture(self, kv_caches: list[torch.Tensor], common: CommonAttentionMetadata) -> None:
        bs = self.batch_size
        attn_metadata = self.builder.build_for_cudagraph_capture(common)
        wrapper = attn_metadata.decode_wrapper
        if wrapper is not None and getattr(wrapper, "_fixed_batch_size", bs) != bs:  # expect: FC103
            raise RuntimeError(f"the decode wrapper handed to the batch-{bs} graph was built for another size")
        # One eager pass so lazily initialised kernels do not allocate inside the graph.
        self.model(self.input_ids[:bs], self.positions[:bs], kv_caches, attn_metadata)
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            output = self.model(self.input_ids[:bs], self.positions[:bs], kv_caches, attn_metadata)
        self.graph = graph
        self.output = output

    def replay(self, num_tokens: int) -> torch.Tensor:
        self.graph.replay()
        return self.output[:num_tokens]


class GPUModelRunner:
    def __init__(self, engine_config: EngineConfig, model_config: ModelConfig) -> None:
        self.engine_config = engine_config
        self.model_config = model_config
        self.device = torch.device(engine_config.device)
        self.max_num_reqs = engine_config.max_num_seqs
        self.max_num_tokens = engine_config.max_num_batched_tokens
        self.max_blocks_per_seq = model_config.max_blocks_per_seq(engine_config.block_size)
        self._use_cuda_graph = not engine_config.enforce_eager  # ok: FC103
        self.cudagraph_batch_sizes = sorted(b for b in engine_config.cuda_graph_sizes if b <= self.max_num_reqs)

        # Persistent device inputs; the captured graphs read them by address.
        self.input_ids = torch.zeros(self.max_num_tokens, dtype=torch.int64, device=self.device)
        self.positions = torch.zeros(self.max_num_tokens, dtype=torch.int64, device=self.device)
        self.query_start_loc = torch.zeros(self.max_num_reqs + 1, dtype=torch.int32, device=self.device)
        self.seq_lens = torch.zeros(self.max_num_reqs, dtype=torch.int32, device=self.device)
        self.slot_mapping = torch.zeros(self.max_num_tokens, dtype=torch.int64, device=self.device)
        # Pinned host mirrors, filled through numpy views.
        pinned = dict(device="cpu", pin_memory=True)
        self.input_ids_cpu = torch.zeros(self.max_num_tokens, dtype=torch.int64, **pinned)
        self.positions_cpu = torch.zeros(self.max_num_tokens, dtype=torch.int64, **pinned)
        self.query_start_loc_cpu = torch.zeros(self.max_num_reqs + 1, dtype=torch.int32, **pinned)
        self.seq_lens_cpu = torch.zeros(self.max_num_reqs, dtype=torch.int32, **pinned)
        self.slot_mapping_cpu = torch.zeros(self.max_num_tokens, dtype=torch.int64, **pinned)
        self.block_table_cpu = torch.zeros((self.max_num_reqs, self.max_blocks_per_seq), dtype=torch.int32, **pinned)
        self.sampled_token_ids_cpu = torch.zeros(64, dtype=torch.int64, **pinned)
        self.output_ready = torch.cuda.Event()

        self.attn_backend = get_attn_backend(model_config.head_dim, engine_config.kv_cache_dtype, engine_config.block_size)
        self.attn_metadata_builder = self.attn_backend.get_builder_cls()(engine_config, model_config, self.device)
        self.sampler = Sampler()
        self.model: Optional[nn.Module] = None
        self.kv_caches: list[torch.Tensor] = []
        self.graph_runners: dict[int, CUDAGraphRunner] = {}

    # ---- start-up -------------------------------------------------------------------------

    def load_model(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        quant_config: Optional[QuantizationConfig] = None
        if self.model_config.quantization is not None:
            # Each layer asks the config for its method while it is built.
            config_cls = get_quantization_config(self.model_config.quantization)
            quant_config = config_cls.from_config(self.model_config.quantization_config)
        model_cls = _MODEL_REGISTRY[self.model_config.architecture]
        model = model_cls(self.model_config, self.engine_config, quant_config, device=self.device)
        model.load_weights(weights)
        for module in model.modules():
            quant_method = getattr(module, "quant_method", None)
            if isinstance(quant_method, QuantizeMethodBase):
                quant_method.process_weights_after_loading(module)
        self.model = model.eval()

    def initialize_kv_cache(self, num_blocks: int) -> None:
        cfg = self.model_config
        num_kv_heads = max(1, cfg.num_key_value_heads // get_tensor_model_parallel_world_size())
        kv_layout = get_kv_cache_layout(self.engine_config, cfg.sliding_window)
        shape = self.attn_backend.get_kv_cache_shape(num_blocks, self.engine_config.block_size, num_kv_heads,
                                                     cfg.head_dim, kv_layout)
        dtype = torch.float8_e4m3fn if self.engine_config.kv_cache_dtype.startswith("fp8") else cfg.torch_dtype
        self.kv_caches = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(cfg.num_hidden_layers)]

    def _dummy_decode_metadata(self, bs: int) -> CommonAttentionMetadata:
        self.input_ids[:bs].zero_()
        self.positions[:bs].zero_()
        self.seq_lens_cpu[:bs] = 1
        self.seq_lens[:bs].fill_(1)
        self.query_start_loc_cpu[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
        self.query_start_loc[: bs + 1].copy_(self.query_start_loc_cpu[: bs + 1])
        self.slot_mapping[:bs].zero_()
        return self._common_metadata(bs, bs, 0, bs, use_cuda_graph=True, padded_num_reqs=bs)

    def _common_metadata(self, num_reqs: int, num_decodes: int, num_prefills: int, num_tokens: int,
                         use_cuda_graph: bool, padded_num_reqs: int) -> CommonAttentionMetadata:
        return CommonAttentionMetadata(
            num_reqs=num_reqs, num_decodes=num_decodes, num_prefills=num_prefills, num_actual_tokens=num_tokens,
            query_start_loc=self.query_start_loc[: num_reqs + 1],
            query_start_loc_cpu=self.query_start_loc_cpu[: num_reqs + 1],
            seq_lens=self.seq_lens[:num_reqs], seq_lens_cpu=self.seq_lens_cpu[:num_reqs],
            block_table_cpu=self.block_table_cpu[:num_reqs], slot_mapping=self.slot_mapping[:num_tokens],
            use_cuda_graph=use_cuda_graph, padded_num_reqs=padded_num_reqs,
        )

    def capture_model(self) -> None:
        if not self._use_cuda_graph:
            return
        pool = torch.cuda.graph_pool_handle()
        # Largest first, so the smaller graphs reuse its memory.
        for bs in reversed(self.cudagraph_batch_sizes):
            common = self._dummy_decode_metadata(bs)
            runner = CUDAGraphRunner(self.model, self.attn_metadata_builder, self.input_ids, self.positions, bs, pool)
            runner.capture(self.kv_caches, common)
            self.graph_runners[bs] = runner
        logger.info("captured %d decode graphs", len(self.graph_runners))

    # ---- every step -----------------------------------------------------------------------

    def _padded_batch_size(self, num_reqs: int) -> Optional[int]:
        idx = bisect.bisect_left(self.cudagraph_batch_sizes, num_reqs)
        return self.cudagraph_batch_sizes[idx] if idx < len(self.cudagraph_batch_sizes) else None

    def _prepare_inputs(self, batch: ScheduledBatch) -> CommonAttentionMetadata:
        num_reqs = batch.num_reqs
        num_tokens = len(batch.token_ids)
        self.input_ids_cpu.numpy()[:num_tokens] = batch.token_ids  # ok: FC101
        self.positions_cpu.numpy()[:num_tokens] = batch.positions
        self.slot_mapping_cpu.numpy()[:num_tokens] = batch.slot_mapping
        query_start_loc_np = self.query_start_loc_cpu.numpy()
        query_start_loc_np[0] = 0
        np.cumsum(batch.query_lens, out=query_start_loc_np[1 : num_reqs + 1])
        self.seq_lens_cpu.numpy()[:num_reqs] = batch.seq_lens
        self.block_table_cpu.numpy()[:num_reqs, : batch.block_table.shape[1]] = batch.block_table

        self.input_ids[:num_tokens].copy_(self.input_ids_cpu[:num_tokens], non_blocking=True)
        self.positions[:num_tokens].copy_(self.positions_cpu[:num_tokens], non_blocking=True)
        self.query_start_loc[: num_reqs + 1].copy_(self.query_start_loc_cpu[: num_reqs + 1], non_blocking=True)
        self.seq_lens[:num_reqs].copy_(self.seq_lens_cpu[:num_reqs], non_blocking=True)
        self.slot_mapping[:num_tokens].copy_(self.slot_mapping_cpu[:num_tokens], non_blocking=True)

        padded = None
        if self._use_cuda_graph and batch.num_prefills == 0:
            padded = self._padded_batch_size(num_reqs)
        return self._common_metadata(num_reqs, batch.num_decodes, batch.num_prefills, num_tokens,
                                     use_cuda_graph=padded is not None, padded_num_reqs=padded or num_reqs)

    def _copy_blocks(self, blocks_to_copy: list[tuple[int, int]]) -> None:
        """Copy-on-write of the blocks forked sequences share (parallel sampling, beam search)."""
        pairs_cpu = torch.tensor(blocks_to_copy, dtype=torch.int32).view(-1)
        # Stage the (src, dst) pairs in the page-index buffer rather than allocating every step.
        staging = self.attn_metadata_builder.paged_kv_indices[: pairs_cpu.numel()]
        staging.copy_(pairs_cpu, non_blocking=True)  # expect: FC104
        src = staging[0::2].long()
        dst = staging[1::2].long()
        for kv_cache in self.kv_caches:
            kv_cache[dst] = kv_cache[src]

    @torch.inference_mode()
    def execute_model(self, batch: ScheduledBatch) -> ModelRunnerOutput:
        assert self.model is not None, "load_model() must run before execute_model()"  # ok: FC109
        common = self._prepare_inputs(batch)
        num_tokens = common.num_actual_tokens
        attn_metadata = self.attn_metadata_builder.build(common)
        if batch.blocks_to_copy:
            self._copy_blocks(batch.blocks_to_copy)
        if common.use_cuda_graph:
            hidden_states = self.graph_runners[common.padded_num_reqs].replay(num_tokens)
        else:
            hidden_states = self.model(self.input_ids[:num_tokens], self.positions[:num_tokens], self.kv_caches,
                                       attn_metadata)
        # Hidden state of each request's last scheduled token.
        logits_indices = common.query_start_loc[1:] - 1
        logits = self.model.compute_logits(hidden_states[logits_indices])
        sampled = self.sampler(logits, batch.sampling_metadata)

        num_reqs = common.num_reqs
        if num_reqs > self.sampled_token_ids_cpu.numel():
            self.sampled_token_ids_cpu = torch.empty(2 * num_reqs, dtype=torch.int64, device="cpu", pin_memory=True)  # ok: FC107
        sampled_cpu = self.sampled_token_ids_cpu[:num_reqs]
        sampled_cpu.copy_(sampled, non_blocking=True)
        self.output_ready.record()
        return ModelRunnerOutput(req_ids=batch.req_ids, sampled_token_ids_cpu=sampled_cpu, ready=self.output_ready)
