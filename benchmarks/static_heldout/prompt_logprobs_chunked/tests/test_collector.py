import numpy as np
import torch

from plp import LogprobConfig, PromptLogprobCollector


def test_register_records_span():
    cfg = LogprobConfig(max_num_tokens=64, max_prompt_logprobs=2)
    col = PromptLogprobCollector(cfg, torch.device("cuda"))
    col.register(7, np.arange(10), top_k=2)
    assert col.span(7) == (0, 9)  # ok: FC109
