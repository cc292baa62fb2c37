"""The process's surroundings, for driver, agent and workers alike: child processes and
their sessions, what a process is doing, signal handlers, network interfaces, bounded
waits, printable text, and refused requests from outsiders."""
