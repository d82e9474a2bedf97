import torch

from ppserve.config import StageConfig
from ppserve.worker import MicroBatch


def check_split(mbs: list[MicroBatch], num_reqs: int) -> None:
    assert sum(mb.num_reqs for mb in mbs) == num_reqs  # ok: FC109


def test_stage_config_defaults():
    cfg = StageConfig()
    assert cfg.workspace_bytes == 256 << 20  # ok: FC109
    workspace = torch.zeros(64 << 20, dtype=torch.uint8)  # ok: FC106
    assert workspace.numel() == 64 << 20
