"""GenPool's core: the pure, torch-free and I/O-free contracts every other package shares.

The scheduling core (requests, slots, admission, preemption policies, the pass and its plan),
the stat line, the step-time model, the operator's tuner and aggregation, and the shared
names. Nothing here reads a clock, a file or the network: `now` is always passed in.
"""
