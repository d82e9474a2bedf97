"""Operator tools: dump the state a replay would read."""

from typing import Dict

from spec_target.engine import TwoLevelSpecEngine


def replay_debug_dump(engine: TwoLevelSpecEngine) -> Dict[str, object]:
    return {
        "accept_ema": engine.accept_ema.item(),  # ok: FC101
        "draft_lens": engine.draft_pool.seq_lens_cpu.tolist(),
        "verify_buckets": sorted(engine.verify_attn.verify_wrappers),
    }
