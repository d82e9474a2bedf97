"""Process-wide knobs, set once at import (overridable from the launcher before start-up)."""


class _GlobalConfig:
    def __init__(self):
        # the decode graphs of a rank share one FlashInfer workspace of this size
        self.attn_workspace_bytes = 160 * 1024 * 1024
        self.sampler_max_k = 64
        self.log_every_steps = 100


global_config = _GlobalConfig()
