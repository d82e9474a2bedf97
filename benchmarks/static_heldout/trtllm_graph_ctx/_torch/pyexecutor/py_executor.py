"""Generator-based executor loop, shaped like TensorRT-LLM's PyExecutor / PyTorchModelEngine."""

from typing import Iterator, Optional

import torch

from _torch.attention_backend.flashinfer import FlashInferAttentionMetadata
from _torch.pyexecutor.cuda_graph_runner import DecodeGraphRunner


class PyTorchModelEngine:
    def __init__(self, model, max_batch_size: int, max_num_tokens: int):
        self.model = model
        self.workspace_bytes = max_num_tokens * model.config.num_attention_heads * 1024
        self.attn_metadata = FlashInferAttentionMetadata(max_num_requests=max_batch_size, max_num_tokens=max_num_tokens)
        self.graph_runner = DecodeGraphRunner(self, [1, 2, 4, 8, 16])
        self.gather_ids = torch.zeros(max_num_tokens, dtype=torch.int64, device="cuda")

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(ids)

    def forward(self, batch) -> torch.Tensor:
        if batch.is_decode and batch.size <= 16:
            return self.graph_runner.replay(batch.input_ids, batch.seq_lens_cpu)
        self.attn_metadata.seq_lens_cpu = batch.seq_lens_cpu
        self.attn_metadata.prepare()
        return self.model(batch.input_ids, self.attn_metadata)


class PyExecutor:
    def __init__(self, engine: PyTorchModelEngine, scheduler):
        self.engine = engine
        self.scheduler = scheduler
        self.new_tokens_host: Optional[torch.Tensor] = None
        self.copy_event = torch.cuda.Event()

    def _executor_loop_steps(self) -> Iterator[torch.Tensor]:
        while (batch := self.scheduler.schedule()) is not None:
            logits = self.engine.forward(batch)
            new_tokens = logits.argmax(dim=-1)
            self.new_tokens_host = new_tokens.to("cpu", non_blocking=True)
            first = int(self.new_tokens_host[0])  # expect: FC101
            self.copy_event.record()
            self.copy_event.synchronize()  # expect: FC101
            finished = [int(t) for t in self.new_tokens_host]  # ok: FC101
            self.engine.attn_metadata.reset_after_step()
            yield first, finished

    def _log_step(self, step: int, new_tokens: torch.Tensor):
        print(f"step {step}: {new_tokens}")  # ok: FC101
