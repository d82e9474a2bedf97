"""Process-wide knobs, set once at import like SGLang's global_config."""


class GlobalConfig:
    def __init__(self) -> None:
        self.flashinfer_workspace_size = 384 * 1024 * 1024


global_config = GlobalConfig()
