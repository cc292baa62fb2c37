"""`elasticrun agent`: the per-node process that connects out to the driver and starts,
stops and watches that node's workers when the driver says so."""
