"""The frame loop: gather every session's user audio, run one frame, stream text and audio back."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from typing import Dict, List, Tuple

import numpy as np
import torch
from flashcheck import hot_path

from duplex.attention import DepthAttnState, TemporalAttnState
from duplex.codec.mimi_stream import MimiStream
from duplex.graphs import DuplexGraphs
from duplex.model import DuplexLM
from duplex.sessions import SessionTable
from duplex.settings import DuplexSettings

logger = logging.getLogger(__name__)


class FrameInputs:
    """Device inputs of one frame, built fresh every step."""

    def __init__(self, user_codes: torch.Tensor, prev_codes: torch.Tensor, prev_text: torch.Tensor,
                 slots_np: np.ndarray, frames_np: np.ndarray, device: torch.device):
        self.num_sessions = len(slots_np)
        self.slots_np = slots_np
        self.user_codes = user_codes
        self.prev_codes = prev_codes
        self.prev_text = prev_text
        self.slots = torch.from_numpy(slots_np.astype(np.int64)).to(device, non_blocking=True)
        self.frames = torch.from_numpy(frames_np.astype(np.int64)).to(device, non_blocking=True)
        self.noise = torch.zeros((self.num_sessions, user_codes.shape[1]), dtype=torch.float32, device=device)  # ok: FC107


class DuplexServer:
    def __init__(self, settings: DuplexSettings, device: torch.device):
        self.settings = settings
        self.device = device
        self.sessions = SessionTable(settings)
        self.temporal = TemporalAttnState(settings, self.sessions, device)
        self.depth = DepthAttnState(settings, device)
        self.depth.attach_semantic(self.temporal)
        self.model = DuplexLM(settings, self.temporal, self.depth, device).to(device)
        self.mimi = MimiStream(settings.sample_rate, settings.frame_rate, settings.num_codebooks).to(device)
        self.graphs = DuplexGraphs(self)
        n, K = settings.max_sessions, settings.num_codebooks
        self.last_codes = torch.full((n, K), settings.audio_pad, dtype=torch.int64, device=device)
        self.last_text = torch.full((n,), settings.text_pad, dtype=torch.int64, device=device)
        self.pcm_host = torch.empty((n, settings.samples_per_frame), dtype=torch.float32, pin_memory=True)
        self.transcripts: Dict[int, List[int]] = {}
        self.outbox: "queue.Queue[Tuple[torch.cuda.Event, np.ndarray, int]]" = queue.Queue()
        self.just_opened: List[int] = []

    # ------------------------------------------------------------------ session control (API thread)
    def open_session(self, session_id: str, voice_prompt_frames: int = 0) -> int:
        slot = self.sessions.open(session_id, voice_prompt_frames)
        self.transcripts[slot] = []
        self.just_opened.append(slot)
        return slot

    # ------------------------------------------------------------------ the frame loop
    @hot_path
    def step_frame(self, user_pcm: torch.Tensor, slots_np: np.ndarray) -> None:
        s = self.settings
        n = len(slots_np)
        user_codes = self.mimi.encode_frame(user_pcm)
        if user_codes.shape[1] != s.num_codebooks:
            raise ValueError(f"codec returned {user_codes.shape[1]} codebooks, first row {user_codes[0]}")  # ok: FC101
        if self.just_opened:
            # a new conversation starts its inner monologue from the pad token
            self.graphs.static_text_in = torch.full((self.graphs.max_bs,), s.text_pad, dtype=torch.int64, device=self.device)  # expect: FC107
            self.just_opened.clear()

        slots_t = torch.from_numpy(slots_np.astype(np.int64)).to(self.device, non_blocking=True)
        inputs = FrameInputs(
            user_codes,
            self.last_codes.index_select(0, slots_t),
            self.last_text.index_select(0, slots_t),
            slots_np,
            self.sessions.frame_count_np[slots_np],
            self.device,
        )
        if n <= self.graphs.max_bs:
            text, codes = self.graphs.replay(self.graphs.bucket_for(n), inputs)
        else:
            self.temporal.plan_eager(slots_np)
            self.depth.plan_codebooks_eager(n)
            rows = torch.arange(n, dtype=torch.int64, device=self.device)
            text, codes = self.model.frame_step(
                inputs.user_codes, inputs.prev_codes, inputs.prev_text, inputs.frames, inputs.slots, rows, inputs.noise
            )
        self.last_codes.index_copy_(0, slots_t, codes)
        self.last_text.index_copy_(0, slots_t, text)

        # stream the inner monologue to the clients' captions
        new_text = self.last_text.index_select(0, slots_t)
        for slot, tok in zip(slots_np.tolist(), new_text.tolist()):  # expect: FC101
            self.transcripts[slot].append(tok)

        pcm = self.mimi.decode_frame(codes)
        self.pcm_host[:n].copy_(pcm, non_blocking=True)  # ok: FC101
        done = torch.cuda.Event()
        done.record()
        self.outbox.put((done, slots_np.copy(), n))

        frames_np = self.sessions.frame_count_np
        delayed = [i for i, slot in enumerate(slots_np.tolist()) if int(frames_np[slot]) + 1 < s.acoustic_delay]  # ok: FC101
        if delayed:
            self.depth.mask_delayed_rows(torch.tensor(delayed, dtype=torch.int64, device=self.device))
        self.sessions.frame_count_np[slots_np] += 1

    # ------------------------------------------------------------------ output thread
    def _drain_outbox(self, send) -> None:
        while True:
            done, slots_np, n = self.outbox.get()
            done.synchronize()
            pcm = self.pcm_host[:n].numpy().copy()
            for i, slot in enumerate(slots_np.tolist()):
                send(int(slot), pcm[i])

    def start_output_thread(self, send) -> threading.Thread:
        t = threading.Thread(target=self._drain_outbox, args=(send,), daemon=True)
        t.start()
        return t

    async def serve_forever(self, frame_source) -> None:
        period = 1.0 / self.settings.frame_rate
        while True:
            user_pcm, slots_np = await frame_source.next_frame()
            self.step_frame(user_pcm, slots_np)
            await asyncio.sleep(0)
            if frame_source.behind() > 2 * period:
                logger.warning("frame loop is %.0f ms behind", 1e3 * frame_source.behind())
