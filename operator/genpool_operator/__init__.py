"""GenPool operator: kopf handlers, child builders, stats rounds (the tuner is genpool_core's)."""
