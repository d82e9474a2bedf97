"""Generation of batch shapes and replay scenarios: strategies, the replay state machine, the ``@flashcheck.fuzz``
decorator (`flashcheck.fuzzing.api.fuzz`). Importing the package imports neither Hypothesis nor torch."""
