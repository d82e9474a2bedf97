"""The server loop: drains the detokenizer's outbox into per-request SSE queues."""
from __future__ import annotations

import queue
from typing import Dict

from ts_engine.engine import ChatEngine
from ts_server.session import ToolStreamSession


class ChatServer:
    def __init__(self, engine: ChatEngine) -> None:
        self.engine = engine
        self.sessions: Dict[str, ToolStreamSession] = {}

    def open(self, rid: str, row: int) -> ToolStreamSession:
        session = self.sessions[rid] = ToolStreamSession(rid, row)
        return session

    async def pump(self) -> int:
        sent = 0
        while True:
            try:
                rid, text, finished = self.engine.detok.outbox.get_nowait()
            except queue.Empty:
                return sent
            session = self.sessions.get(rid)
            if session is None:
                continue
            for chunk in session.on_text(text):
                await session.queue.put(chunk)
                sent += 1
            if finished:
                await session.queue.put(f'data: {{"finish_reason": "{session.finish_reason()}"}}\n\n')
                await session.queue.put(None)
                self.engine.release_rows([session.row])
                del self.sessions[rid]

    def parser_kinds(self) -> Dict[str, str]:
        return {rid: s.parser._backend for rid, s in self.sessions.items()}  # ok: FC103

    def describe(self) -> str:
        return self.engine.attn.describe("schema")
