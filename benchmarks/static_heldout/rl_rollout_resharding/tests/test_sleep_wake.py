"""Sleep / wake-up round trip of the rollout engine (needs one GPU)."""

import pytest
import torch

from rollout.config import RolloutConfig
from rollout.engine import RolloutEngine


def check_released(engine: RolloutEngine) -> None:
    assert engine.backend.decode_workspace is None  # ok: FC109
    assert not engine.graph_runner.graphs


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_sleep_then_generate():
    cfg = RolloutConfig(num_layers=2, hidden_size=256, num_qo_heads=4, num_kv_heads=2, head_dim=64,
                        vocab_size=1024, num_pages=256, max_running=8, capture_bs=(1, 2, 4, 8))
    engine = RolloutEngine(cfg)
    engine.graph_runner.recapture(engine.kv_cache)
    first = engine.generate([[1, 2, 3], [4, 5]], max_new_tokens=4)
    engine.sleep()
    check_released(engine)
    second = engine.generate([[1, 2, 3], [4, 5]], max_new_tokens=4)
    assert [len(r) for r in first] == [len(r) for r in second]
