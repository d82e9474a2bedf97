"""Data-parallel serving: several GPUs driven from one process."""

from dpserve.core import (PAGE_SIZE, SWA_WINDOW, TC_GRAPH_WORKSPACE_BYTES, DeviceBatch, DPConfig, Request,
                          StepResult, build_device_batch, context_workspace_bytes, decode_workspace_bytes, last_page_lens)

__all__ = ["PAGE_SIZE", "SWA_WINDOW", "TC_GRAPH_WORKSPACE_BYTES", "DeviceBatch", "DPConfig", "Request",
           "StepResult", "build_device_batch", "context_workspace_bytes", "decode_workspace_bytes", "last_page_lens"]
