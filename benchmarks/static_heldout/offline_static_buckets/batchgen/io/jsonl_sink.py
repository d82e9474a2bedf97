"""Writes finished rows as JSON lines, in the order of the input file."""
from __future__ import annotations

import json
from typing import Dict, List, TextIO

import numpy as np


class JsonlSink:
    def __init__(self, fh: TextIO, num_prompts: int):
        self.fh = fh
        self.pending: Dict[int, List[int]] = {}
        self.next_to_write = 0
        self.done = np.zeros(num_prompts, dtype=bool)

    def put(self, prompt_index: int, tokens: List[int]) -> None:
        self.pending[prompt_index] = tokens
        self.done[prompt_index] = True
        while self.next_to_write in self.pending:
            toks = self.pending.pop(self.next_to_write)
            self.fh.write(json.dumps({"index": self.next_to_write, "tokens": toks}) + "\n")
            self.next_to_write += 1

    def flush(self) -> None:
        self.fh.flush()
