"""Generation-only CUDA graphs, one per batch size, replayed on a copy stream's inputs."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

import torch

from tensorrt_llm._torch.attention_backend import FlashInferAttentionMetadata

if TYPE_CHECKING:
    from .model_engine import DecoderStack, PyTorchModelEngine

_DUMMY_REQUEST_BASE = 1 << 30


class CUDAGraphRunner:
    def __init__(self, engine: "PyTorchModelEngine", batch_sizes: list[int], vocab_size: int):
        assert list(batch_sizes) == sorted(batch_sizes), "capture sizes must be ascending"  # expect: FC109
        self._engine_ref = weakref.ref(engine)
        self.batch_sizes = list(batch_sizes)
        self.vocab_size = vocab_size
        max_bs = self.batch_sizes[-1]
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.static_outputs: dict[int, torch.Tensor] = {}
        self.static_inputs: dict[str, torch.Tensor] = {
            "input_ids": torch.zeros(max_bs, dtype=torch.int64, device="cuda"),
            "position_ids": torch.zeros(max_bs, dtype=torch.int64, device="cuda"),
        }
        self._copy_stream = torch.cuda.Stream()
        self._capture_stream = torch.cuda.Stream()
        self._copy_done = torch.cuda.Event()
        self._memory_pool = None
        self._dummy_ids = [_DUMMY_REQUEST_BASE + i for i in range(max_bs)]
        self.graph_metadata = FlashInferAttentionMetadata(
            max_num_requests=max_bs,
            max_num_tokens=max_bs,
            kv_cache_manager=engine.kv_cache_manager,
            is_cuda_graph=True,
            use_trtllm_gen=engine.use_trtllm_gen,
            workspace_buffer=engine.attn_metadata.workspace_buffer,
        )
        engine.kv_cache_manager.attach_metadata(self.graph_metadata)

    @property
    def engine(self) -> "PyTorchModelEngine":
        return self._engine_ref()

    @property
    def model(self) -> "DecoderStack":
        return self.engine.model

    def capture(self, batch_size: int) -> None:
        meta = self.graph_metadata
        ids = self._dummy_ids[:batch_size]
        self.engine.kv_cache_manager.add_dummy_requests(ids)
        meta.num_contexts = 0
        meta.request_ids = ids
        meta.seq_lens = torch.ones(batch_size, dtype=torch.int32)
        meta.kv_cache_params = self.engine.dummy_kv_cache_params(batch_size)
        meta.prepare()
        inputs = {name: buf[:batch_size] for name, buf in self.static_inputs.items()}
        for _ in range(2):
            self.model.forward(**inputs, attn_metadata=meta)
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._memory_pool, stream=self._capture_stream):
            self.static_outputs[batch_size] = self.model.forward(**inputs, attn_metadata=meta)
        self._memory_pool = graph.pool()
        self.graphs[batch_size] = graph

    def padded_size(self, n: int) -> int:
        return next(bs for bs in self.batch_sizes if bs >= n)

    def replay(self, num_requests: int, inputs: dict[str, torch.Tensor], step_meta: FlashInferAttentionMetadata) -> torch.Tensor:
        batch_size = self.padded_size(num_requests)
        with torch.cuda.stream(self._copy_stream):
            for name, new in inputs.items():
                if new.shape[0] > self.static_inputs[name].shape[0]:
                    self.static_inputs[name] = torch.empty_like(new)  # expect: FC107
                self.static_inputs[name][: new.shape[0]].copy_(new, non_blocking=True)
            self._copy_done.record()
        torch.cuda.current_stream().wait_event(self._copy_done)  # ok: FC101
        if not torch.all(inputs["input_ids"] < self.vocab_size):  # expect: FC101
            raise ValueError("token id out of range in a generation batch")

        meta = self.graph_metadata
        pad = batch_size - num_requests
        meta.num_contexts = 0
        meta.request_ids = list(step_meta.request_ids) + self._dummy_ids[:pad]
        meta.seq_lens = torch.cat([step_meta.seq_lens, torch.ones(pad, dtype=torch.int32)])  # ok: FC107
        meta.kv_cache_params = step_meta.kv_cache_params._replace(
            num_cached_tokens_per_seq=list(step_meta.kv_cache_params.num_cached_tokens_per_seq) + [0] * pad
        )
        meta.prepare()
        self.graphs[batch_size].replay()
        return self.static_outputs[batch_size][:num_requests]
