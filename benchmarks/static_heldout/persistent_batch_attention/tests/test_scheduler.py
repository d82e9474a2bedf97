import torch

from pba.config import EngineConfig
from pba.scheduler import HolisticScheduler, Request


def _sched(device="cpu"):
    cfg = EngineConfig(max_batch_size=4, max_num_tokens=64, prefill_chunk=32, num_pages=128, page_size=16)
    return HolisticScheduler(cfg, cfg.max_batch_size, cfg.prefill_chunk, cfg.page_size, torch.device(device))


def test_prompt_split_into_chunks():
    s = _sched()
    s.add(Request(rid=0, prompt=list(range(80))))
    step = s.schedule_step()
    assert step.info.num_reqs == 1  # ok: FC109
    assert step.info.qo_lens.max().item() == 32  # ok: FC101


def test_decode_rows_first():
    s = _sched()
    s.running.append(Request(rid=1, prompt=[1, 2, 3], num_computed=3, output=[7]))
    s.add(Request(rid=2, prompt=list(range(10))))
    step = s.schedule_step()
    assert step.info.num_decode == 1
