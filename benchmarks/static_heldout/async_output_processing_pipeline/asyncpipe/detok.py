"""Incremental detokenisation and stop checks, run on the post-processing thread."""

from dataclasses import dataclass, field
from typing import List, Optional, Sequence


@dataclass
class DetokState:
    token_ids: List[int] = field(default_factory=list)
    prefix_offset: int = 0
    read_offset: int = 0
    text: str = ""


class IncrementalDetokenizer:
    def __init__(self, tokenizer, backend: str = "fast"):
        self.tokenizer = tokenizer
        self._backend = backend

    def step(self, state: DetokState, new_ids: Sequence[int]) -> str:
        state.token_ids.extend(new_ids)
        if self._backend == "fast":  # ok: FC103
            prefix = self.tokenizer.decode(state.token_ids[state.prefix_offset : state.read_offset])
            full = self.tokenizer.decode(state.token_ids[state.prefix_offset :])
        else:
            prefix = "".join(self.tokenizer.convert_ids_to_tokens(state.token_ids[state.prefix_offset : state.read_offset]))
            full = "".join(self.tokenizer.convert_ids_to_tokens(state.token_ids[state.prefix_offset :]))
        if full.endswith("\ufffd"):
            return ""
        delta = full[len(prefix) :]
        state.prefix_offset = state.read_offset
        state.read_offset = len(state.token_ids)
        state.text += delta
        return delta


@dataclass
class StopCriteria:
    eos_token_id: int
    max_tokens: int
    stop_strings: List[str] = field(default_factory=list)
    ignore_eos: bool = False


class StopChecker:
    def check(self, crit: StopCriteria, state: DetokState, num_generated: int, last_id: int) -> Optional[str]:
        if not crit.ignore_eos and last_id == crit.eos_token_id:
            return "eos"
        if num_generated >= crit.max_tokens:
            return "length"
        tail = state.text[-64:]
        for s in crit.stop_strings:
            if s in tail:
                state.text = state.text[: state.text.rfind(s)]
                return "stop"
        return None
