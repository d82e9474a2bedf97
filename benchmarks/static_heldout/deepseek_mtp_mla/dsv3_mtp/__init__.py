"""DeepSeek-V3 MTP speculative decoding on FlashInfer MLA."""
from dsv3_mtp.spec import DeepseekV3Config, SpecBatch, SpecLimits
from dsv3_mtp.worker import MTPWorker

__all__ = ["DeepseekV3Config", "SpecBatch", "SpecLimits", "MTPWorker"]
