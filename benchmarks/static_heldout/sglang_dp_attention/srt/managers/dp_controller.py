"""The DP controller routes requests to DP-attention ranks; schedulers all-gather token counts on the host."""
from __future__ import annotations

import functools
import operator
from dataclasses import dataclass
from typing import Dict, List

import torch
import torch.distributed as dist


@dataclass
class TokenizedGenerateReqInput:
    rid: str
    input_ids: List[int]
    data_parallel_rank: int = -1


class DataParallelController:
    def __init__(self, server_args, worker_queues: Dict[int, object]):
        assert server_args.enable_dp_attention, "the DP controller is only used with DP attention"  # expect: FC109
        self.workers, self.loads = worker_queues, {rank: 0 for rank in worker_queues}

    def _pick_worker(self) -> int:
        assert self.workers, "no DP ranks registered"  # ok: FC109
        return min(self.loads.items(), key=operator.itemgetter(1))[0]  # shortest queue, in prompt tokens

    @functools.singledispatchmethod
    def dispatch(self, req) -> None:  # other message types go to every rank
        for queue in self.workers.values():
            queue.put(req)

    @dispatch.register
    def _(self, req: TokenizedGenerateReqInput) -> None:
        match req.data_parallel_rank:
            case -1:
                rank = self._pick_worker()
            case pinned if pinned in self.workers:
                rank = pinned
            case other:
                raise ValueError(f"request {req.rid} pinned to unknown DP rank {other}")
        self.loads[rank] += len(req.input_ids)
        self.workers[rank].put(req)


def prepare_mlp_sync_batch(local_num_tokens: int, dp_size: int, cpu_group) -> List[int]:
    global_info = torch.empty(dp_size, dtype=torch.int64)
    dist.all_gather_into_tensor(global_info, torch.tensor([local_num_tokens], dtype=torch.int64), group=cpu_group)
    return global_info.tolist()  # ok: FC101
