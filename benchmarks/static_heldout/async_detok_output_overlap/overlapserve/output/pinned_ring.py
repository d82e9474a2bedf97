import torch


class PinnedOutputRing:
    """`depth` pinned host slots for sampled ids, each with the event recorded after its D2H copy."""

    def __init__(self, max_batch, depth, device):
        self.depth = depth
        self.host_ids = [torch.empty(max_batch, dtype=torch.int64, pin_memory=True) for _ in range(depth)]
        self.host_logprobs = [torch.empty(max_batch, dtype=torch.float32, pin_memory=True) for _ in range(depth)]
        self.events = [torch.cuda.Event() for _ in range(depth)]
        self.copy_stream = torch.cuda.Stream(device=device)
        self.next_slot = 0

    def take_slot(self):
        slot = self.next_slot
        self.next_slot = (slot + 1) % self.depth
        return slot
