"""Workers under `elasticrun agent`s: the agent channel's messages, the driver's hub,
a worker as the driver sees it, and the launcher."""
