import os


class GlobalConfig:
    def __init__(self):
        self.flashinfer_workspace_size = int(os.environ.get("FLASHINFER_WORKSPACE_SIZE", 384 * 1024 * 1024))


global_config = GlobalConfig()
