"""duplex: serve many full-duplex spoken conversations on one GPU.

Every 80 ms frame, each open session contributes the Mimi codes of what its user said and receives the model's
inner-monologue text token plus the Mimi codes of what the model says. A 7B temporal transformer runs once per frame
over all sessions; a small depth transformer then produces the frame's codebooks one after another.
"""

__version__ = "0.2.0"
