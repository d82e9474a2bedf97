"""Long-context serving with RoPE scaling chosen per request length band."""
