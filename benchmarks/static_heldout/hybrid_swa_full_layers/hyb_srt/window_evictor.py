"""Returns the pages of finished requests to both pools."""

from __future__ import annotations

import torch

from hyb_srt.attn_backend import HybridAttnBackend
from swahybrid.pools import NULL_PAGE, TwoPools


class SwaWindowEvictor:
    def __init__(self, pools: TwoPools, backend: HybridAttnBackend) -> None:
        self.pools = pools
        self.backend = backend

    def release(self, rid: int) -> None:
        """Free a finished request; its SWA pages may be handed out again before the next replay."""
        freed = torch.tensor(self.pools.swa.pages.get(rid, []), dtype=torch.int32, device=self.backend.device)
        self.pools.release(rid)
        if freed.numel():
            stale = torch.isin(self.backend.swa_kv_indices, freed)
            # scrub the freed ids from the bound SWA indices so a stale row reads the null page
            self.backend.swa_kv_indices.masked_fill_(stale, NULL_PAGE)  # expect: FC104
