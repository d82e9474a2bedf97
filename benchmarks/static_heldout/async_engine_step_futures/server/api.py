"""Client-facing coroutine API; each request resolves through its own future."""

import asyncio
import itertools

from asyncserve.protocol import Request
from server.engine_loop import AsyncEngine


class EngineClient:
    def __init__(self, engine: AsyncEngine):
        self.engine = engine
        self._ids = itertools.count()

    async def generate(self, prompt_ids: list, max_new_tokens: int = 128) -> list:
        assert max_new_tokens > 0  # expect: FC109
        loop = asyncio.get_running_loop()
        req = Request(rid=next(self._ids), prompt=list(prompt_ids), max_new_tokens=max_new_tokens, done=loop.create_future())
        self.engine.scheduler.add(req)
        return await req.done

    async def stream(self):
        while True:
            yield await self.engine.results.get()
