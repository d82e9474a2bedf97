from dataclasses import dataclass

import torch


@dataclass
class StreamSet:
    prefill: torch.cuda.Stream
    decode: torch.cuda.Stream
    prefill_done: torch.cuda.Event
    decode_done: torch.cuda.Event
    copy_done: torch.cuda.Event


def make_streams(device: torch.device) -> StreamSet:
    return StreamSet(
        prefill=torch.cuda.Stream(device=device, priority=0),
        decode=torch.cuda.Stream(device=device, priority=-1),
        prefill_done=torch.cuda.Event(),
        decode_done=torch.cuda.Event(),
        copy_done=torch.cuda.Event(),
    )
