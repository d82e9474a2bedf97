"""Request router for a prefill/decode-disaggregated deployment: picks a prefill and a decode instance
per request and drives the prefill instances with asyncio."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass
from typing import Dict, List, Protocol, Sequence


class InstanceClient(Protocol):
    name: str

    async def submit(self, request_id: str, payload: dict) -> dict: ...

    def load(self) -> float: ...


@dataclass
class RoutedRequest:
    request_id: str
    prompt_len: int
    prefill: str
    decode: str


class RequestRouter:
    def __init__(self, prefill: Sequence[InstanceClient], decode: Sequence[InstanceClient], max_prompt_len: int):
        self.prefill = list(prefill)
        self.decode = list(decode)
        self.max_prompt_len = max_prompt_len
        self._next_decode = itertools.cycle(range(len(self.decode)))
        self.inflight: Dict[str, RoutedRequest] = {}

    def route(self, request_id: str, prompt_len: int) -> RoutedRequest:
        assert prompt_len <= self.max_prompt_len, "prompt longer than the prefill instances accept"  # expect: FC109
        prefill = min(self.prefill, key=lambda c: c.load())
        decode = self.decode[next(self._next_decode)]
        routed = RoutedRequest(request_id, prompt_len, prefill.name, decode.name)
        self.inflight[request_id] = routed
        return routed

    async def dispatch(self, requests) -> List[dict]:
        routed = [self.route(r.request_id, len(r.prompt_token_ids)) for r in requests]
        by_name = {c.name: c for c in itertools.chain(self.prefill, self.decode)}
        results = await asyncio.gather(*(by_name[r.prefill].submit(r.request_id, {"decode": r.decode}) for r in routed))
        self._check_inflight()
        return list(results)

    def finish(self, request_id: str) -> None:
        self.inflight.pop(request_id, None)

    def _check_inflight(self) -> None:
        assert len(self.inflight) <= 1024 * max(1, len(self.decode)), "router leaks in-flight requests"  # ok: FC109
