"""Decode graph runner, shaped like TensorRT-LLM's _torch/pyexecutor/cuda_graph_runner.py."""

from typing import Dict, Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper as DecodeWrapper

from _torch.attention_backend.flashinfer import FlashInferAttentionMetadata


class DraftDecoder:
    def __init__(self, wrapper: DecodeWrapper, kv_cache: torch.Tensor):
        self.wrapper = wrapper
        self.kv_cache = kv_cache

    @classmethod
    def from_workspace(cls, workspace: torch.Tensor, kv_cache: torch.Tensor) -> "DraftDecoder":
        return cls(DecodeWrapper(workspace, "HND", use_cuda_graph=False), kv_cache)

    def step(self, q: torch.Tensor) -> torch.Tensor:
        return self.wrapper.run(q, self.kv_cache)  # expect: FC108


class DecodeGraphRunner:
    def __init__(self, engine, batch_sizes: list):
        self.engine = engine
        self.batch_sizes = sorted(batch_sizes)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.metadata: Dict[int, FlashInferAttentionMetadata] = {}
        self.input_ids = torch.zeros(max(self.batch_sizes), dtype=torch.int64, device="cuda")
        self.seq_lens_cpu = torch.ones(max(self.batch_sizes), dtype=torch.int32)
        self.draft: Optional[DraftDecoder] = None

    def warmup_and_record(self, kv_cache: torch.Tensor):
        ws = torch.zeros(self.engine.workspace_bytes, dtype=torch.uint8, device="cuda")
        self.draft = DraftDecoder.from_workspace(ws, kv_cache)
        for bs in reversed(self.batch_sizes):
            meta = FlashInferAttentionMetadata(max_num_requests=bs, max_num_tokens=bs, is_cuda_graph=True, workspace=ws)
            meta.seq_lens_cpu = self.seq_lens_cpu[:bs]
            meta.seq_lens = meta.seq_lens_cpu.to("cuda", non_blocking=True)
            with meta.capturing():
                meta.prepare()
                torch.cuda.synchronize()  # ok: FC101
                if meta.seq_lens.max() > 4096:  # expect: FC101
                    continue
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    q = self.engine.embed(self.input_ids[:bs])
                    self.outputs[bs] = meta.decode_wrapper.run(q, kv_cache)  # ok: FC108
                    self.draft.step(q)
            self.graphs[bs], self.metadata[bs] = g, meta

    def replay(self, input_ids: torch.Tensor, seq_lens_cpu: torch.Tensor) -> torch.Tensor:
        bs, *_ = input_ids.shape
        padded = next(b for b in self.batch_sizes if b >= bs)
        self.input_ids[:bs].copy_(input_ids)
        meta = self.metadata[padded]
        meta.seq_lens_cpu = seq_lens_cpu
        meta.prepare()
        self.graphs[padded].replay()
        return self.outputs[padded][:bs]
