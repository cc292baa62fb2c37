"""Starting worker processes: locally as subprocesses, remotely over SSH."""
