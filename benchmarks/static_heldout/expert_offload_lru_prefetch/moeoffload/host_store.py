import torch


class HostExpertStore:
    """Every expert's FFN weights in pinned host memory, indexed [layer, expert]."""

    def __init__(self, cfg, dtype=torch.bfloat16):
        self.cfg = cfg
        self.w13 = torch.empty(
            (cfg.num_layers, cfg.num_experts, 2 * cfg.ffn, cfg.hidden), dtype=dtype, pin_memory=True
        )
        self.w2 = torch.empty((cfg.num_layers, cfg.num_experts, cfg.hidden, cfg.ffn), dtype=dtype, pin_memory=True)
        self.loaded = set()

    def load_checkpoint_shard(self, layer, expert, w13_cpu, w2_cpu):
        self.w13[layer, expert].copy_(w13_cpu)
        self.w2[layer, expert].copy_(w2_cpu)
        self.loaded.add((layer, expert))

    def nbytes(self):
        return self.w13.numel() * self.w13.element_size() + self.w2.numel() * self.w2.element_size()
