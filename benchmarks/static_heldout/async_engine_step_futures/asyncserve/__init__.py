"""An asyncio serving engine whose step metadata is built on a thread while the previous step runs."""
