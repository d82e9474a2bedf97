"""Vision-language serving pieces shared by the runners: config, image inputs, scatter."""

from vlm.config import VISION_WS_BYTES, VLMConfig
from vlm.image_inputs import ImageInputs, ImageRequest, PromptBatch, PromptBatchFactory
from vlm.scatter import image_token_positions, scatter_image_embeds

__all__ = [
    "VISION_WS_BYTES",
    "VLMConfig",
    "ImageInputs",
    "ImageRequest",
    "PromptBatch",
    "PromptBatchFactory",
    "image_token_positions",
    "scatter_image_embeds",
]
