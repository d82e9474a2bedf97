"""Process-wide runtime knobs."""


class RuntimeSettings:
    def __init__(self):
        self.graph_workspace_bytes = 160 * 1024 * 1024
        self.publish_every_step = True


runtime_settings = RuntimeSettings()
