"""The gRPC service: the server, its servicer (thin: convert and delegate to the Scorer),
the call gate, metrics and the process resources a replica draws on."""
