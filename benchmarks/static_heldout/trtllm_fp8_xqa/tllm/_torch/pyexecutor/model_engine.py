from __future__ import annotations

import torch

from ..attention_backend import ATTENTION_BACKENDS
from ..modules.attention import Fp8DecoderModel
from .cuda_graph_runner import DecodeGraphRunner


class PyTorchModelEngine:
    def __init__(self, model_config, backend_config, kv_cache_manager, graph_batch_sizes: list[int]) -> None:
        self.model = Fp8DecoderModel(model_config, torch.device("cuda"))
        metadata_cls = ATTENTION_BACKENDS[backend_config.name]
        self.attn_metadata = metadata_cls(**backend_config.kwargs, kv_cache_manager=kv_cache_manager)
        self.graph_runner = DecodeGraphRunner(self, graph_batch_sizes)

    def load_weights(self, weights) -> None:
        self.model.load_state_dict(weights, strict=False)
        for layer in self.model.layers:
            layer.process_weights_after_loading()
        self.graph_runner.capture_all()

    @torch.inference_mode()
    def forward(self, scheduled) -> torch.Tensor:
        kv_lens = [r.kv_len for r in scheduled.requests]
        self.last_kv_lens_cpu = torch.tensor(kv_lens, dtype=torch.int32)  # ok: FC107
        input_ids = scheduled.input_ids.to("cuda", non_blocking=True)
        slots = scheduled.slot_mapping.to("cuda", non_blocking=True)
        if scheduled.num_contexts == 0 and len(kv_lens) <= self.graph_runner.max_bs:
            return self.graph_runner.replay(input_ids, slots, kv_lens)
        md = self.attn_metadata
        md.is_cuda_graph, md.num_contexts = False, scheduled.num_contexts
        md.request_kv_lens, md.request_q_lens = kv_lens, [r.q_len for r in scheduled.requests]
        md.prepare()
        return self.model(input_ids, slots, md)
