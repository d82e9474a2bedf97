"""Turns sampled tokens into per-request text deltas, finish reasons, logprobs and stream frames."""

import logging
import struct
from dataclasses import dataclass, field
from typing import BinaryIO, Dict, List, Optional, Set

from frontend.detokenizer import IncrementalDetokenizer
from protoserve.forward_batch import ModelRunnerOutput, SamplingParams

logger = logging.getLogger(__name__)

FRAME_TOKEN = 1
FRAME_TEXT = 2


@dataclass
class RequestState:
    req_id: str
    stream_id: int
    eos_token_id: int
    stop_token_ids: Set[int]
    stop_strings: List[str]
    max_new_tokens: int
    want_logprobs: bool
    want_top_logprobs: bool
    detok: IncrementalDetokenizer
    output_ids: List[int] = field(default_factory=list)
    logprobs: List[float] = field(default_factory=list)
    top_logprobs: List[Dict[str, str]] = field(default_factory=list)
    in_tool_call: bool = False
    finish_reason: Optional[str] = None


@dataclass
class RequestOutput:
    req_id: str
    delta_text: str
    token_id: int
    finished: bool
    finish_reason: Optional[str] = None


class OutputProcessor:
    def __init__(self, tokenizer, binary_sink: Optional[BinaryIO] = None, tool_call_token_id: Optional[int] = None):
        self.tokenizer = tokenizer
        self.piece_table = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        self.binary_sink = binary_sink
        self.tool_call_token_id = tool_call_token_id
        self.states: Dict[str, RequestState] = {}

    def add_request(self, req_id: str, stream_id: int, prompt_ids: List[int], params: SamplingParams) -> None:
        assert req_id not in self.states, f"request {req_id} is already registered"  # expect: FC109
        self.states[req_id] = RequestState(
            req_id=req_id,
            stream_id=stream_id,
            eos_token_id=self.tokenizer.eos_token_id,
            stop_token_ids=set(params.stop_token_ids),
            stop_strings=list(params.stop),
            max_new_tokens=params.max_new_tokens,
            want_logprobs=params.logprobs,
            want_top_logprobs=params.top_logprobs > 0,
            detok=IncrementalDetokenizer(self.tokenizer, self.piece_table, prompt_ids),
        )

    def _lookup(self, out: ModelRunnerOutput) -> List[RequestState]:
        missing = [rid for rid in out.req_ids if rid not in self.states]
        if missing:
            raise KeyError(f"outputs for unknown requests {missing} (tokens {out.next_token_ids})")  # ok: FC101
        return [self.states[rid] for rid in out.req_ids]

    def process_outputs(self, out: ModelRunnerOutput, token_ids_cpu: List[int]) -> List[RequestOutput]:
        """Called once per step with the step's outputs and the host copy of its sampled tokens."""
        states = self._lookup(out)
        if self.tool_call_token_id is not None and self.tool_call_token_id in out.next_token_ids:  # expect: FC101
            self._mark_tool_calls(states, token_ids_cpu)

        logprobs = None
        if out.next_token_logprobs is not None and any(s.want_logprobs for s in states):
            logprobs = [float(lp) for lp in out.next_token_logprobs]  # expect: FC101
        if out.topk_ids is not None:
            self._attach_top_logprobs(states, out)

        results = []
        for i, (state, tok) in enumerate(zip(states, token_ids_cpu)):
            state.output_ids.append(tok)
            if logprobs is not None and state.want_logprobs:
                state.logprobs.append(logprobs[i])
            delta = state.detok.append(tok)
            reason = self._finish_reason(state, tok, delta)
            if reason is not None:
                state.finish_reason = reason
                del self.states[state.req_id]
            results.append(RequestOutput(state.req_id, delta, tok, reason is not None, reason))

        if self.binary_sink is not None:
            self._emit_frames(states, out, results)
        return results

    def _finish_reason(self, state: RequestState, tok: int, delta: str) -> Optional[str]:
        if tok == state.eos_token_id or tok in state.stop_token_ids:  # ok: FC101
            return "stop"
        hit = state.detok.find_stop(state.stop_strings, len(delta))
        if hit is not None:
            state.detok.text = state.detok.text[: hit[1]]
            return "stop"
        if len(state.output_ids) >= state.max_new_tokens:
            return "length"
        return None

    def _mark_tool_calls(self, states: List[RequestState], token_ids_cpu: List[int]) -> None:
        for state, tok in zip(states, token_ids_cpu):
            if tok == self.tool_call_token_id:
                state.in_tool_call = True

    def _attach_top_logprobs(self, states: List[RequestState], out: ModelRunnerOutput) -> None:
        for state, ids, lps in zip(states, out.topk_ids, out.topk_logprobs):
            if not state.want_top_logprobs:
                continue
            pieces = [self.piece_table[t] for t in ids]  # expect: FC101
            scores = [format(lp, ".4f") for lp in lps]  # expect: FC101
            state.top_logprobs.append(dict(zip(pieces, scores)))

    def _emit_frames(self, states: List[RequestState], out: ModelRunnerOutput, results: List[RequestOutput]) -> None:
        sink = self.binary_sink
        for state, tok in zip(states, out.next_token_ids):
            sink.write(struct.pack("<BIq", FRAME_TOKEN, state.stream_id, tok))  # expect: FC101
        for state, res in zip(states, results):
            if not res.delta_text:
                continue
            payload = res.delta_text.encode("utf-8")
            sink.write(struct.pack("<BII", FRAME_TEXT, state.stream_id, len(payload)) + payload)  # ok: FC101
        sink.flush()
