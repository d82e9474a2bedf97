"""Static rules FC100-FC199, one per module. `RULES` lists them all: a new rule is its module and one line here."""

from __future__ import annotations

from flashcheck.verifier.engine import Rule
from flashcheck.verifier.rules import (
    fc100_bare_suppression,
    fc101_host_sync,
    fc102_device_tensor_to_plan,
    fc103_private_attribute,
    fc104_graph_buffer_written,
    fc105_empty_workspace,
    fc106_constant_workspace,
    fc107_realloc_on_replay,
    fc108_non_graph_wrapper,
    fc109_assert_validates_input,
    fc199_file_does_not_parse,
)

__all__ = ["RULES"]

RULES: tuple[type[Rule], ...] = (
    fc100_bare_suppression.BareSuppression,
    fc101_host_sync.HostSyncInHotPath,
    fc102_device_tensor_to_plan.DeviceTensorToPlan,
    fc103_private_attribute.FlashinferPrivateAttribute,
    fc104_graph_buffer_written.GraphBufferWrittenElsewhere,
    fc105_empty_workspace.EmptyWorkspaceForZeroingKernel,
    fc106_constant_workspace.ConstantWorkspaceSize,
    fc107_realloc_on_replay.ReallocOnReplayPath,
    fc108_non_graph_wrapper.NonGraphWrapperInCapture,
    fc109_assert_validates_input.AssertValidatesInput,
    fc199_file_does_not_parse.FileDoesNotParse,
)
