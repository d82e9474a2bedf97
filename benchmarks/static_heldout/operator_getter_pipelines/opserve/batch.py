"""The step batch the scheduler hands to the runner, and the getters every stage reads it with."""

from __future__ import annotations

import dataclasses
import enum
import functools
import itertools
import operator
from typing import List, Optional, Sequence

import torch


class ForwardMode(enum.IntEnum):
    EXTEND = 0
    DECODE = 1


@dataclasses.dataclass
class StepBatch:
    forward_mode: ForwardMode
    batch_size: int
    request_ids: List[str]
    input_ids: torch.Tensor
    positions: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    out_cache_loc: torch.Tensor
    # Pages the attention reads from the cache: every page in decode, the cached prefix in extend.
    kv_page_ids: torch.Tensor
    temperatures: torch.Tensor
    extend_prefix_lens: Optional[torch.Tensor] = None
    extend_seq_lens_cpu: Optional[torch.Tensor] = None
    extend_qo_indptr: Optional[torch.Tensor] = None

    @property
    def is_decode(self) -> bool:
        return self.forward_mode == ForwardMode.DECODE


# Field getters. Stages read the batch only through these, so a renamed field breaks in one place.
mode_and_size = operator.attrgetter("forward_mode", "batch_size")
seq_lens_of = operator.attrgetter("seq_lens")
seq_lens_cpu_of = operator.attrgetter("seq_lens_cpu")
temps_of = operator.attrgetter("temperatures")
kv_page_ids_of = operator.attrgetter("kv_page_ids")
qo_indptr_of = operator.attrgetter("extend_qo_indptr")
extend_prefix_lens_of = operator.attrgetter("extend_prefix_lens")
extend_seq_lens_cpu_of = operator.attrgetter("extend_seq_lens_cpu")

# Graph inputs the replay copies in place, and the slot tables it refreshes.
STATIC_INPUTS = ("input_ids", "positions")
SLOT_INPUTS = ("req_pool_indices", "out_cache_loc")
static_inputs_of = operator.attrgetter(*STATIC_INPUTS)
slot_inputs_of = operator.attrgetter(*SLOT_INPUTS)


@dataclasses.dataclass
class ScheduledRequest:
    """What the scheduler decided for one request this step (host data only)."""

    rid: str
    token_ids: List[int]
    prefix_len: int
    req_pool_idx: int
    page_ids: List[int]
    temperature: float


def _h2d(t: torch.Tensor, *, device: torch.device) -> torch.Tensor:
    return t.pin_memory().to(device, non_blocking=True)


def _slots(req: ScheduledRequest, *, page_size: int) -> List[int]:
    positions = range(req.prefix_len, req.prefix_len + len(req.token_ids))
    return [req.page_ids[p // page_size] * page_size + p % page_size for p in positions]


def _cached_pages(req: ScheduledRequest, *, page_size: int, decode: bool) -> List[int]:
    if decode:
        return req.page_ids[: -(-(req.prefix_len + 1) // page_size)]
    return req.page_ids[: -(-req.prefix_len // page_size)]


def build_step_batch(
    reqs: Sequence[ScheduledRequest], mode: ForwardMode, page_size: int, device: torch.device
) -> StepBatch:
    decode = mode == ForwardMode.DECODE
    to_dev = functools.partial(_h2d, device=device)
    extend_lens = list(map(len, map(operator.attrgetter("token_ids"), reqs)))
    prefix_lens = list(map(operator.attrgetter("prefix_len"), reqs))
    seq_lens_cpu = torch.tensor(list(map(operator.add, prefix_lens, extend_lens)), dtype=torch.int32)
    input_ids = torch.tensor(list(itertools.chain.from_iterable(map(operator.attrgetter("token_ids"), reqs))))
    positions = torch.cat([torch.arange(p, p + e) for p, e in zip(prefix_lens, extend_lens)])
    pool_indices = torch.tensor(list(map(operator.attrgetter("req_pool_idx"), reqs)), dtype=torch.int64)
    slots = itertools.chain.from_iterable(map(functools.partial(_slots, page_size=page_size), reqs))
    pages = map(functools.partial(_cached_pages, page_size=page_size, decode=decode), reqs)
    out_cache_loc = torch.tensor(list(slots), dtype=torch.int64)
    kv_page_ids = torch.tensor(list(itertools.chain.from_iterable(pages)), dtype=torch.int32)
    temps = torch.tensor(list(map(operator.attrgetter("temperature"), reqs)), dtype=torch.float32)

    input_ids_gpu, positions_gpu, pool_gpu, seq_lens_gpu, loc_gpu, pages_gpu, temps_gpu = map(
        to_dev, (input_ids, positions, pool_indices, seq_lens_cpu, out_cache_loc, kv_page_ids, temps)
    )
    batch = StepBatch(
        forward_mode=mode,
        batch_size=len(reqs),
        request_ids=list(map(operator.attrgetter("rid"), reqs)),
        input_ids=input_ids_gpu,
        positions=positions_gpu,
        req_pool_indices=pool_gpu,
        seq_lens=seq_lens_gpu,
        seq_lens_cpu=seq_lens_cpu,
        out_cache_loc=loc_gpu,
        kv_page_ids=pages_gpu,
        temperatures=temps_gpu,
    )
    if not decode:
        extend_lens_cpu = torch.tensor(extend_lens, dtype=torch.int32)
        qo_indptr = torch.zeros(len(reqs) + 1, dtype=torch.int32)
        qo_indptr[1:] = torch.cumsum(extend_lens_cpu, 0)
        batch.extend_prefix_lens = to_dev(torch.tensor(prefix_lens, dtype=torch.int32))
        batch.extend_seq_lens_cpu = extend_lens_cpu
        batch.extend_qo_indptr = to_dev(qo_indptr)
    return batch
