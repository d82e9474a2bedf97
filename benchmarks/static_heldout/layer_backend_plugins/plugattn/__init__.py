"""plugattn: a serving engine whose attention backend is chosen per layer from a plugin registry."""
