"""Per-request sampling parameters, staged from the host into device buffers each step."""

from dataclasses import dataclass
from typing import Dict, Optional, Sequence

import numpy as np
import torch

from fsample.config import SamplingEngineConfig
from fsample.rows import expand_rows

_PARAM_DTYPES = {
    "temperature": torch.float32,
    "top_k": torch.int32,
    "top_p": torch.float32,
    "seed": torch.int64,
    "offset": torch.int64,
    "count": torch.int64,
}
_PARAM_NAMES = tuple(_PARAM_DTYPES)


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    seed: Optional[int] = None
    n: int = 1


@dataclass
class RequestSampling:
    params: SamplingParams
    num_generated: int


@dataclass
class StagedParams:
    num_rows: int
    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    seeds: torch.Tensor
    offsets: torch.Tensor
    max_top_k: int
    any_seeded: bool


class SamplingParamsStager:
    def __init__(self, cfg: SamplingEngineConfig):
        self.cfg = cfg
        self.device = cfg.device
        self.vocab_size = cfg.vocab_size
        cap = cfg.initial_requests
        self.host_bufs: Dict[str, torch.Tensor] = {
            name: torch.zeros(cap, dtype=dt, pin_memory=True) for name, dt in _PARAM_DTYPES.items()
        }
        self.device_bufs: Dict[str, torch.Tensor] = {
            name: torch.zeros(cfg.max_batch, dtype=dt, device=self.device) for name, dt in _PARAM_DTYPES.items()
        }
        # one seed per sample row; sized for one sample per request
        self.row_seeds = torch.zeros(cfg.max_batch, dtype=torch.int64, device=self.device)
        self._views = {name: buf.numpy() for name, buf in self.host_bufs.items()}
        self._rng = np.random.default_rng()

    def _check_views(self) -> None:
        cap = self.host_bufs["seed"].shape[0]
        assert all(v.shape[0] == cap for v in self._views.values()), "stale numpy views"  # ok: FC109

    def _grow_host(self, cap: int) -> None:
        for name, buf in list(self.host_bufs.items()):
            self.host_bufs[name] = torch.zeros(cap, dtype=buf.dtype, pin_memory=True)  # ok: FC107
        self._views = {name: buf.numpy() for name, buf in self.host_bufs.items()}
        self._check_views()

    def stage(self, reqs: Sequence[RequestSampling]) -> StagedParams:
        num_req = len(reqs)
        n = sum(r.params.n for r in reqs)
        assert n <= self.cfg.max_rows, "more sample rows than the decode graphs hold"  # expect: FC109
        if num_req > self.host_bufs["seed"].shape[0]:
            self._grow_host(2 * num_req)
        v = self._views
        any_seeded = False
        for i, r in enumerate(reqs):
            p = r.params
            v["temperature"][i] = p.temperature
            v["top_k"][i] = p.top_k if p.top_k > 0 else self.vocab_size
            v["top_p"][i] = p.top_p
            v["seed"][i] = p.seed if p.seed is not None else int(self._rng.integers(1 << 62))
            v["offset"][i] = r.num_generated
            v["count"][i] = p.n
            any_seeded = any_seeded or p.seed is not None
        max_top_k = int(self.host_bufs["top_k"][:num_req].max())  # ok: FC101
        for name in _PARAM_NAMES:
            self.device_bufs[name][:num_req].copy_(self.host_bufs[name][:num_req], non_blocking=True)  # ok: FC104
        if n > self.row_seeds.numel():
            self.row_seeds = torch.empty(n, dtype=torch.int64, device=self.device)  # expect: FC107
        counts = self.device_bufs["count"][:num_req]
        fork = np.concatenate([np.arange(r.params.n, dtype=np.int64) for r in reqs])
        fork_dev = torch.from_numpy(fork).to(self.device, non_blocking=True)
        self.row_seeds[:n] = expand_rows(self.device_bufs["seed"][:num_req], counts, n) + fork_dev
        return StagedParams(
            num_rows=n,
            temperature=expand_rows(self.device_bufs["temperature"][:num_req], counts, n),
            top_k=expand_rows(self.device_bufs["top_k"][:num_req], counts, n),
            top_p=expand_rows(self.device_bufs["top_p"][:num_req], counts, n),
            seeds=self.row_seeds[:n],
            offsets=expand_rows(self.device_bufs["offset"][:num_req], counts, n),
            max_top_k=max_top_k,
            any_seeded=any_seeded,
        )
