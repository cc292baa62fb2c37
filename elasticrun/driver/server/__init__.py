"""The driver's HTTP server: it serves worker requests as machine events, and nothing else."""
