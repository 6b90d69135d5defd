"""GenPool operator: kopf handlers, child builders, stats and the tuner."""
