"""Which pool owns the shared page buffers this step, and which graph bucket fits a batch."""

from dualspec.config import SpecConfig
from dualspec.pools.draft_pool import DraftDecodePool
from dualspec.pools.verify_pool import VerifyPool


class PoolSwapper:
    def __init__(self, cfg: SpecConfig, draft: DraftDecodePool, verify: VerifyPool):
        self.cfg = cfg
        self.draft = draft
        self.verify = verify
        self.pools = {"draft": draft, "verify": verify}
        self.active = None
        self.swaps = 0
        self._kv_layout = cfg.kv_layout

    def bucket_for(self, bs: int):
        fits = [b for b, w in self.draft.wrappers.items() if w._fixed_batch_size >= bs]  # expect: FC103
        return min(fits) if fits else None

    def swap_to(self, name: str):
        pool = self.pools[name]
        if pool is not self.active:
            self.active = pool
            pool.shared.owner = name
            self.swaps += 1
        return pool
