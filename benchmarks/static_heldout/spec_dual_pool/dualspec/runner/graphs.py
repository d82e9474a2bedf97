"""One GraphSet per model, each capturing into its own memory pool; the step bodies are closures over the
model and its attention state."""
from __future__ import annotations

from typing import Callable, Dict, Protocol

import torch

from dualspec.attn import DraftAttnState, ModelAttnState, TargetAttnState
from dualspec.model import DecoderModel


class StepFn(Protocol):
    def __call__(self, input_ids: torch.Tensor) -> torch.Tensor: ...


def make_draft_step(model: DecoderModel, state: DraftAttnState, bs: int) -> StepFn:
    wrapper = state.graph_decode[bs]

    def step(input_ids: torch.Tensor) -> torch.Tensor:
        slots = state.slots[:bs]
        if (slots < 0).any():  # expect: FC101
            raise RuntimeError("a draft token has no KV slot")
        return model.finish(wrapper.run(model.project(input_ids, slots), model.kv_cache))  # ok: FC108

    return step


def make_verify_step(model: DecoderModel, state: TargetAttnState, bs: int) -> StepFn:
    def step(input_ids: torch.Tensor) -> torch.Tensor:
        q = model.project(input_ids, state.lookahead_slots[: bs * state.k1])
        return model.finish(state.eager_verify.run(q, model.kv_cache))  # expect: FC108

    return step


def make_step_fn(model: DecoderModel, state: ModelAttnState, bs: int) -> StepFn:
    match state:
        case DraftAttnState():
            return make_draft_step(model, state, bs)
        case TargetAttnState():
            return make_verify_step(model, state, bs)
    raise TypeError(f"no step for {type(state).__name__}")


class GraphSet:
    def __init__(self, model: DecoderModel, state: ModelAttnState, tokens_per_req: int, device: torch.device):
        self.model, self.state, self.tokens_per_req = model, state, tokens_per_req
        self.pool = torch.cuda.graph_pool_handle()  # this model's own pool
        self.input_ids = torch.zeros(state.batch_sizes[-1] * tokens_per_req, dtype=torch.long, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}

    def record(self, prepare: Callable[[int], int]) -> None:
        for bs in reversed(self.state.batch_sizes):
            prepare(bs)
            step, n = make_step_fn(self.model, self.state, bs), bs * self.tokens_per_req
            step(self.input_ids[:n])
            torch.cuda.synchronize()  # ok: FC101
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                self.outputs[bs] = step(self.input_ids[:n])
            self.graphs[bs] = graph

    def replay(self, bs: int, input_ids: torch.Tensor) -> torch.Tensor:
        self.input_ids[: input_ids.shape[0]].copy_(input_ids)
        self.graphs[bs].replay()
        return self.outputs[bs]
