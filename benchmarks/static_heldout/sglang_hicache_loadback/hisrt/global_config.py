"""Process-wide knobs, set once at import time (SGLang keeps the same kind of object)."""


class GlobalConfig:
    def __init__(self) -> None:
        self.verbosity = 0
        # FlashInfer float workspace of the decode CUDA graphs
        self.flashinfer_workspace_size = 384 * 1024 * 1024
        self.default_init_new_token_ratio = 0.7
        self.retract_decode_steps = 20
        # load a host-resident prefix back only when it is at least this many tokens
        self.hicache_load_back_threshold = 256


global_config = GlobalConfig()
