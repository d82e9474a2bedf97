"""prmscore: a process-reward-model scoring server.

A request is one question and K candidate solutions. The question is prefilled
once, its pages are shared by every candidate, each candidate is prefilled over
them, and the model's score head is read at every step-tag token. No decode.
"""
