"""GenPool GEN (decode) worker: the engine loop, the torch model runner and the HTTP server."""
