from typing import List, Tuple

import torch

from lckv.config import OffloadConfig
from lckv.host_pool import HostPagePool
from lckv.window import DeviceWindow, WindowView


class PrefetchScheduler:
    """Copies the step's cold pages host -> device window on a side stream,
    `ahead` layer groups before the compute stream reaches them."""

    def __init__(self, pool: HostPagePool, window: DeviceWindow, cfg: OffloadConfig):
        self.pool = pool
        self.window = window
        self.cfg = cfg
        self.ahead = cfg.prefetch_groups_ahead
        self.copy_stream = torch.cuda.Stream()
        self.done: List[torch.cuda.Event] = [torch.cuda.Event() for _ in range(cfg.num_groups)]
        self._pairs: List[Tuple[int, int]] = []

    def begin_step(self, view: WindowView) -> None:
        self._pairs = list(zip(view.copy_src_np.tolist(), view.copy_dst_np.tolist()))

    def issue(self, group: int) -> None:
        if group >= self.cfg.num_groups:
            return
        compute = torch.cuda.current_stream()
        first = group * self.cfg.layers_per_group
        with torch.cuda.stream(self.copy_stream):
            # slots being refilled may still be read by the previous step's groups
            self.copy_stream.wait_stream(compute)
            for layer in range(first, first + self.cfg.layers_per_group):
                host_kv, dev_kv = self.pool.kv[layer], self.window.kv[layer]
                for src, dst in self._pairs:
                    dev_kv[dst].copy_(host_kv[src], non_blocking=True)
            self.done[group].record(self.copy_stream)
        if group == self.cfg.num_groups - 1:
            # the next step's remap may hand these slots out again
            self.copy_stream.synchronize()  # expect: FC101

    def wait(self, group: int) -> None:
        torch.cuda.current_stream().wait_event(self.done[group])  # ok: FC101
