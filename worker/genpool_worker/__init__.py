"""GenPool GEN (decode) worker: scheduling core, simulator and engine."""
