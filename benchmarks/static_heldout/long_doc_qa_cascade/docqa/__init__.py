"""Long-document QA serving: one shared document prefix, many short questions."""
