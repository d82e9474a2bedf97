"""Process-wide knobs that are not worth a command-line flag."""


class GlobalConfig:
    def __init__(self):
        # shared by every FlashInfer wrapper of the attention backend
        self.flashinfer_workspace_size = 384 * 1024 * 1024
        self.retract_decode_steps = 20
        self.defrag_interval = 512
        self.defrag_min_free_ratio = 0.2


global_config = GlobalConfig()
