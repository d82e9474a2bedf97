"""The policy server: a fixed-rate loop over the fleet, one action chunk per policy tick."""
from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import numpy as np
import torch

import flashcheck
from vlapolicy.config import PolicyConfig
from vlapolicy.control.action_queue import ActionChunkQueue
from vlapolicy.policy.attention import PolicyAttention
from vlapolicy.policy.chunk_graphs import ChunkGraphs
from vlapolicy.policy.model import VLAPolicy

logger = logging.getLogger(__name__)


@dataclass
class TickInputs:
    frames: torch.Tensor  # [R, cams, 3, S, S] uint8, device
    proprio: torch.Tensor  # [R, proprio_dim], device
    first_tokens: torch.Tensor  # [R] device, the last executed action token
    positions: torch.Tensor  # [R] device
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor
    kv_indptr_rows: np.ndarray  # [chunk, R + 1]
    last_rows: np.ndarray  # [chunk, R]
    temperature: float
    obs_tokens: Optional[torch.Tensor] = None


class RobotSlot:
    def __init__(self, robot_id: str, page_base: int, pages: int):
        self.robot_id = robot_id
        self.page_base = page_base
        self.max_pages = pages
        self.instruction_len = 0
        self.seq_len = 0
        self.last_token = 0
        self.frames: Optional[np.ndarray] = None
        self.proprio: Optional[np.ndarray] = None


class PolicyServer:
    def __init__(self, cfg: PolicyConfig, device_index: int = 0, temperature: float = 0.7):
        self.cfg = cfg
        self.device = torch.device("cuda", device_index)
        self.temperature = temperature
        self.attn = PolicyAttention(cfg, self.device)
        self.policy = VLAPolicy(cfg, self.attn).to(self.device)
        self.graphs = ChunkGraphs(cfg, self.policy, self.attn, self.device)
        self.queue = ActionChunkQueue(cfg.max_chunk, cfg.num_robots, cfg.action_dim, cfg.ensemble_decay, self.device)
        R = cfg.num_robots
        self.slots: List[RobotSlot] = [RobotSlot(f"arm{i}", i * cfg.max_pages_per_robot, cfg.max_pages_per_robot) for i in range(R)]
        self.by_id: Dict[str, int] = {s.robot_id: i for i, s in enumerate(self.slots)}
        self.frames_pinned = torch.zeros(
            R, cfg.num_cameras, 3, cfg.image_size, cfg.image_size, dtype=torch.uint8, pin_memory=True
        )
        self.proprio_pinned = torch.zeros(R, cfg.proprio_dim, dtype=torch.float32, pin_memory=True)
        self.actions_host = torch.zeros(R, cfg.max_chunk, cfg.action_dim, dtype=torch.float32, pin_memory=True)
        self.hold_action = torch.zeros(R, cfg.action_dim, dtype=torch.float32, device=self.device)
        self.sinks: List[Callable[[int, np.ndarray], None]] = []
        self.out_q: "queue.Queue" = queue.Queue(maxsize=4)
        self.tick_id = 0
        self._lock = threading.Lock()
        self.publisher = threading.Thread(target=self._publish_loop, daemon=True)

    # -- robots --------------------------------------------------------------------------

    def submit_observation(self, robot_id: str, frames: List[np.ndarray], proprio: np.ndarray) -> None:
        assert len(frames) == self.cfg.num_cameras  # expect: FC109
        slot = self.slots[self.by_id[robot_id]]
        with self._lock:
            slot.frames = np.stack(frames)
            slot.proprio = proprio

    def set_instruction(self, robot_ids: List[str], token_ids: List[List[int]]) -> None:
        """A new task: prefill the instruction into the first pages of each robot."""
        idx = [self.by_id[r] for r in robot_ids]
        lens = [len(t) for t in token_ids]
        qo = np.zeros(len(idx) + 1, dtype=np.int32)
        np.cumsum(lens, out=qo[1:])
        pages = [(n + self.cfg.page_size - 1) // self.cfg.page_size for n in lens]
        kv = np.zeros(len(idx) + 1, dtype=np.int32)
        np.cumsum(pages, out=kv[1:])
        indices = np.concatenate(
            [np.arange(self.slots[i].page_base, self.slots[i].page_base + p, dtype=np.int32) for i, p in zip(idx, pages)]
        )
        self.attn.plan_instruction(
            torch.from_numpy(qo),
            torch.from_numpy(kv),
            torch.from_numpy(indices).to(self.device),
            torch.tensor(lens, dtype=torch.int32, device=self.device),
        )
        ids = torch.tensor([t for seq in token_ids for t in seq], dtype=torch.int64, device=self.device)
        self.policy.prefill_instruction(ids)
        for i, n in zip(idx, lens):
            self.slots[i].instruction_len = n
            self.slots[i].seq_len = n

    def reset_robot(self, robot_id: str) -> None:
        i = self.by_id[robot_id]
        slot = self.slots[i]
        # forget the episode: the robot's pages hold nothing until the next instruction
        self.attn.kv_indices[slot.page_base : slot.page_base + slot.max_pages].zero_()  # expect: FC104
        self.queue.reset_robot(i)
        slot.seq_len = slot.instruction_len = 0

    # -- the loop ------------------------------------------------------------------------

    def _chunk_size(self) -> int:
        # execute at control_hz, re-plan at policy_hz; round up to a captured size
        need = int(np.ceil(self.cfg.control_hz / self.cfg.policy_hz))
        return min(c for c in self.cfg.chunk_sizes if c >= need) if need <= self.cfg.max_chunk else self.cfg.max_chunk

    def _gather_tick(self, chunk: int) -> TickInputs:
        R, P = self.cfg.num_robots, self.cfg.page_size
        with self._lock:
            for i, s in enumerate(self.slots):
                if s.frames is not None:
                    self.frames_pinned[i].copy_(torch.from_numpy(s.frames))
                    self.proprio_pinned[i].copy_(torch.from_numpy(s.proprio))
        n_obs = self.cfg.obs_tokens_per_robot
        seq = np.array([s.seq_len for s in self.slots], dtype=np.int64)
        after_obs = seq + n_obs
        pages = (after_obs + chunk + P - 1) // P
        kv_indptr = np.zeros(R + 1, dtype=np.int32)
        np.cumsum(pages, out=kv_indptr[1:])
        indices = np.concatenate([np.arange(s.page_base, s.page_base + p, dtype=np.int32) for s, p in zip(self.slots, pages)])
        obs_last = ((after_obs - 1) % P + 1).astype(np.int32)
        steps = after_obs[None, :] + np.arange(1, chunk + 1)[:, None]
        last_rows = ((steps - 1) % P + 1).astype(np.int32)
        rows = np.tile(kv_indptr, (chunk, 1))
        return TickInputs(
            frames=self.frames_pinned.to(self.device, non_blocking=True),
            proprio=self.proprio_pinned.to(self.device, non_blocking=True),
            first_tokens=torch.tensor([s.last_token for s in self.slots], dtype=torch.int64, device=self.device),
            positions=torch.from_numpy(after_obs).to(self.device, non_blocking=True),
            kv_indptr_cpu=torch.from_numpy(kv_indptr),
            kv_indices=torch.from_numpy(indices).to(self.device, non_blocking=True),
            kv_last_page_len_cpu=torch.from_numpy(obs_last),
            kv_indptr_rows=rows,
            last_rows=last_rows,
            temperature=self.temperature,
        )

    def _encode_observations(self, tick: TickInputs) -> None:
        obs = self.policy.encode(tick.frames, tick.proprio)
        tick.obs_tokens = torch.cat([obs, self.policy.embed(tick.first_tokens)[:, None]], dim=1)  # ok: FC107

    @flashcheck.hot_path
    def control_step(self) -> int:
        chunk = self._chunk_size()
        tick = self._gather_tick(chunk)
        self._encode_observations(tick)
        self.attn.plan_obs(tick)
        self.policy.prefill_obs(tick.obs_tokens)
        actions = self.graphs.replay(chunk, tick)
        if torch.isnan(actions).any():  # expect: FC101
            actions = torch.nan_to_num(actions, nan=0.0)
        blended, ok = self.queue.ensemble(actions)
        first = torch.where(ok[:, None], blended, self.hold_action)  # ok: FC101
        actions = torch.cat([first[:, None], actions[:, 1:]], dim=1)
        self.actions_host[:, :chunk].copy_(actions, non_blocking=True)  # ok: FC101
        done = torch.cuda.Event()
        done.record()
        self.out_q.put((done, chunk, self.tick_id))
        for s in self.slots:
            s.seq_len += self.cfg.obs_tokens_per_robot + chunk
        self.tick_id += 1
        return chunk

    def _publish_loop(self) -> None:
        while True:
            done, chunk, tick_id = self.out_q.get()
            done.synchronize()  # ok: FC101
            host = self.actions_host[:, :chunk].numpy().copy()
            for sink in self.sinks:
                for r in range(self.cfg.num_robots):
                    sink(tick_id, host[r])

    def run_forever(self) -> None:
        self.graphs.capture_all()
        self.publisher.start()
        period = 1.0 / self.cfg.policy_hz
        next_t = time.perf_counter()
        while True:
            chunk = self.control_step()
            next_t += period
            slack = next_t - time.perf_counter()
            if slack > 0:
                time.sleep(slack)
            else:
                logger.warning("policy tick overran by %.1f ms (chunk=%d)", -slack * 1e3, chunk)
