"""Layer-wise KV connector for disaggregated prefill/decode serving.

The scheduler side builds a :class:`ConnectorMetadata` every step; the worker side
starts the remote loads before the forward (``start_load_kv``), waits for each
layer inside its attention (``wait_for_layer_load``), ships the layer's new KV
after it (``save_kv_layer``) and joins the save stream at the end of the step
(``wait_for_save``).
"""
from kvconn.config import GRAPH_WORKSPACE_MB, ConnectorConfig, EngineConfig
from kvconn.connector import LayerwiseConnectorWorker
from kvconn.metadata import ConnectorMetadata, ConnectorMetadataBuilder, ReqMeta

__all__ = [
    "GRAPH_WORKSPACE_MB",
    "ConnectorConfig",
    "EngineConfig",
    "LayerwiseConnectorWorker",
    "ConnectorMetadata",
    "ConnectorMetadataBuilder",
    "ReqMeta",
]
