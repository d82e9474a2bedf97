from rtp_llm.models_py.utils.workspace import (
    get_trtllm_gen_workspace,
    get_zero_workspace,
    workspace_bytes_for,
)

__all__ = ["get_trtllm_gen_workspace", "get_zero_workspace", "workspace_bytes_for"]
