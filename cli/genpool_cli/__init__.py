"""``genpool``: the one command line over the simulator, worker, operator and devcluster."""
