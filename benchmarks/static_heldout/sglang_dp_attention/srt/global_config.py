"""Process-wide knobs, set once at import time (SGLang's ``global_config``)."""


class GlobalConfig:
    def __init__(self):
        self.flashinfer_workspace_size = 384 * 1024 * 1024


global_config = GlobalConfig()
