"""Engine loop: launch step N, then turn step N-1's tokens into outputs while N runs."""

import logging
from typing import List, Optional, Protocol

from frontend.output_processor import OutputProcessor, RequestOutput
from protoserve.config import EngineConfig
from protoserve.forward_batch import ModelRunnerOutput, SamplingParams, SchedulerOutput
from protoserve.model_runner import ModelRunner

logger = logging.getLogger(__name__)


class Scheduler(Protocol):
    def add_request(self, req_id: str, prompt_ids: List[int], params: SamplingParams) -> None: ...
    def schedule(self) -> Optional[SchedulerOutput]: ...
    def finish(self, req_id: str, reason: str) -> None: ...


class LLMEngine:
    def __init__(self, cfg: EngineConfig, scheduler: Scheduler, tokenizer, enable_cuda_graph: bool = True):
        self.runner = ModelRunner(cfg)
        if enable_cuda_graph:
            self.runner.init_cuda_graphs()
        self.scheduler = scheduler
        self.processor = OutputProcessor(tokenizer, tool_call_token_id=getattr(tokenizer, "tool_call_id", None))
        self._inflight: Optional[ModelRunnerOutput] = None
        self._next_stream_id = 0

    def add_request(self, req_id: str, prompt_ids: List[int], params: SamplingParams) -> None:
        if params.max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens must be positive, got {params.max_new_tokens}")
        self.processor.add_request(req_id, self._next_stream_id, prompt_ids, params)
        self.scheduler.add_request(req_id, prompt_ids, params)
        self._next_stream_id += 1

    def step(self) -> List[RequestOutput]:
        sched = self.scheduler.schedule()
        launched = self.runner.execute_step(sched) if sched is not None else None
        outputs = self._resolve() if self._inflight is not None else []
        self._inflight = launched
        return outputs

    def _resolve(self) -> List[RequestOutput]:
        prev = self._inflight
        assert prev is not None and prev.copy_done is not None  # ok: FC109
        prev.copy_done.synchronize()  # ok: FC101
        token_ids = prev.next_token_ids_cpu.tolist()
        outputs = self.processor.process_outputs(prev, token_ids)
        for res in outputs:
            if res.finished:
                self.scheduler.finish(res.req_id, res.finish_reason)
        return outputs
