import io
import struct

import pytest
import torch

from frontend.output_processor import OutputProcessor
from protoserve.forward_batch import ModelRunnerOutput, SamplingParams

requires_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


class ToyTokenizer:
    eos_token_id = 2
    all_special_ids = [0, 1, 2]
    vocab = ["<pad>", "<s>", "</s>"] + [f"w{i}" for i in range(3, 64)]

    def __len__(self):
        return len(self.vocab)

    def convert_ids_to_tokens(self, ids):
        return [self.vocab[i] for i in ids]

    def convert_tokens_to_string(self, tokens):
        return " ".join(tokens)


def _output(req_ids, tokens, device):
    ids = torch.tensor(tokens, dtype=torch.int64, device=device)
    return ModelRunnerOutput(
        req_ids=req_ids,
        next_token_ids=ids,
        next_token_ids_cpu=ids.cpu(),
        copy_done=torch.cuda.Event(),
        next_token_logprobs=torch.zeros(len(tokens), device=device),
    )


def _check_frames(raw, expected_tokens):
    tokens = []
    while raw:
        if raw[0] == 1:
            tokens.append(struct.unpack_from("<BIq", raw)[2])
            raw = raw[struct.calcsize("<BIq"):]
        else:
            raw = raw[struct.calcsize("<BII") + struct.unpack_from("<BII", raw)[2]:]
    assert tokens == expected_tokens  # ok: FC109


@requires_gpu
def test_eos_finishes_request():
    proc = OutputProcessor(ToyTokenizer())
    proc.add_request("a", 0, [1, 5, 6], SamplingParams(max_new_tokens=8))
    proc.add_request("b", 1, [1, 7], SamplingParams(max_new_tokens=8))
    out = _output(["a", "b"], [9, 2], "cuda")
    results = proc.process_outputs(out, out.next_token_ids.tolist())
    for res, tok in zip(results, out.next_token_ids):
        if tok == ToyTokenizer.eos_token_id:  # ok: FC101
            assert res.finished and res.finish_reason == "stop"
        else:
            assert not res.finished


@requires_gpu
def test_token_frames_match_sampled_ids():
    sink = io.BytesIO()
    proc = OutputProcessor(ToyTokenizer(), binary_sink=sink)
    proc.add_request("a", 7, [1], SamplingParams(max_new_tokens=4))
    out = _output(["a"], [11], "cuda")
    proc.process_outputs(out, [11])
    _check_frames(sink.getvalue(), [11])
