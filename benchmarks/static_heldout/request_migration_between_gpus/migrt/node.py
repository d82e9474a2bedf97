"""The node loop: pump migrations, step every GPU, rebalance now and then."""

from __future__ import annotations

from typing import Dict, Tuple

from gpumig.limits import MigrationLimits
from gpumig.topology import NodeTopology
from migrt.balancer import LoadBalancer
from migrt.migrator import KVMigrator
from migrt.worker import MigrationWorker


class MigrationNode:
    def __init__(self, limits: MigrationLimits, rebalance_every: int = 64) -> None:
        self.topo = NodeTopology()
        self.workers = [MigrationWorker(rank, limits, self.topo) for rank in range(2)]
        self.migrators: Dict[Tuple[int, int], KVMigrator] = {
            (s, d): KVMigrator(self.workers[s], self.workers[d], self.topo.link(s, d), limits)
            for (s, d) in self.topo.links
        }
        self.balancer = LoadBalancer(self.workers, self.migrators)
        self.rebalance_every = rebalance_every
        self.steps = 0

    def start(self) -> None:
        for w in self.workers:
            w.graphs.record_all()

    def run_once(self) -> None:
        for m in self.migrators.values():
            m.pump()
        for w in self.workers:
            w.step()
        self.steps += 1
        if self.steps % self.rebalance_every == 0:
            self.balancer.rebalance()
