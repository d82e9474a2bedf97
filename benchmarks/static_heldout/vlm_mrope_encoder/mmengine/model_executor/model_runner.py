from __future__ import annotations

import torch

from ..layers import FlashInferVLMBackend
from ..models.vlm import VLMForCausalLM
from ..multimodal import EncoderCacheManager, MRopePositionsBuilder, MultimodalEmbeddingBuilder, MultimodalInputs
from ..server_args import ServerArgs
from ..vision.attention import VisionAttentionPlanner
from .cuda_graph_runner import CudaGraphRunner
from .forward_batch import ForwardBatch


class ModelRunner:
    def __init__(self, server_args: ServerArgs, model_config, token_to_kv_pool, device: torch.device) -> None:
        self.server_args, self.model_config, self.device = server_args, model_config, device
        self.token_to_kv_pool = token_to_kv_pool
        self.req_to_token = torch.zeros((server_args.max_running_requests, server_args.context_len), dtype=torch.int32, device=device)
        self.model = VLMForCausalLM(model_config).to(device)
        self.attn_backend = FlashInferVLMBackend(self)
        self.mrope_builder = MRopePositionsBuilder(server_args.chunked_prefill_size, device)
        self.encoder_cache = EncoderCacheManager(server_args.encoder_cache_bytes, model_config.hidden_size)
        self.embed_builder = MultimodalEmbeddingBuilder(self.encoder_cache)
        self.cuda_graph_runner = None

    def init_vision(self, vision_config, build_vision_tower) -> None:
        window_workspace = torch.zeros(self.server_args.vit_workspace_bytes, dtype=torch.uint8, device=self.device)  # ok: FC106
        planner = VisionAttentionPlanner(
            self.attn_backend.prefill_wrapper_ragged._float_workspace_buffer,  # expect: FC103
            window_workspace,
            vision_config,
            self.device,
        )
        self.encoder_cache.encoder = build_vision_tower(vision_config, planner).to(self.device)

    def init_cuda_graphs(self) -> None:
        self.cuda_graph_runner = CudaGraphRunner(self)
        self.cuda_graph_runner.capture()

    def add_mm_inputs(self, mm: MultimodalInputs) -> None:
        mm.to_device(self.device)

    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        fb.mrope_positions = self.mrope_builder.build(fb)
        if fb.forward_mode.is_decode() and self.cuda_graph_runner and fb.batch_size <= self.cuda_graph_runner.max_bs:
            return self.cuda_graph_runner.replay(fb)
        self.attn_backend.init_forward_metadata(fb)
        embeds = self.model.embed_tokens(fb.input_ids)
        if fb.forward_mode.is_extend():
            embeds = self.embed_builder.build(fb, embeds)
        return self.model.forward(fb.input_ids, fb.mrope_positions, fb, input_embeds=embeds)

    def on_requests_finished(self, freed_slots: list[int]) -> None:
        """Runs on the scheduler's output thread, while the next step may already be replaying."""
        freed = torch.tensor(freed_slots, dtype=torch.int32).pin_memory().to(self.device, non_blocking=True)
        kv_indices = self.attn_backend.cuda_graph_kv_indices
        kv_indices.masked_fill_(torch.isin(kv_indices, freed), 0)  # expect: FC104
