"""Pooled serving core: limits, tensor/metadata/staging pools and recycled step metadata."""
