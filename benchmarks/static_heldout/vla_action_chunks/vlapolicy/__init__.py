"""vlapolicy: a vision-language-action policy server for a fleet of robot arms.

Every policy tick the server encodes each robot's camera frames, prefills the observation
tokens after the robot's instruction, and decodes a chunk of action tokens through a CUDA
graph captured for that chunk size; the control loop then executes the chunk at a fixed rate.
"""
