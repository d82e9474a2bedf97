"""Engine core: pydantic configuration and attrs step metadata."""

from apm.config import EngineConfig as EngineConfig
