import numpy as np
import torch

from ppserve.config import PipelineConfig
from ppserve.microbatch import Request, ScheduledBatch, split_batch


def _batch() -> ScheduledBatch:
    reqs = [
        Request(0, prompt_len=5, num_computed=0, num_new=5, page_ids=[3], token_offset=0),
        Request(1, prompt_len=4, num_computed=20, num_new=1, page_ids=[4, 5], token_offset=5),
        Request(2, prompt_len=4, num_computed=9, num_new=1, page_ids=[6], token_offset=6),
    ]
    return ScheduledBatch(step=1, requests=reqs, input_ids_np=np.arange(7, dtype=np.int64), page_size=16)


def test_split_keeps_every_token():
    mbs = split_batch(_batch(), 2, torch.device("cuda"))
    assert sum(mb.num_tokens for mb in mbs) == 7  # ok: FC109
    assert mbs[0].is_prefill and not mbs[1].is_prefill


def test_stage_specs_cover_all_layers():
    cfg = PipelineConfig()
    specs = cfg.stage_specs()
    assert specs[0].first_layer == 0
    assert specs[-1].last_layer == cfg.num_layers
