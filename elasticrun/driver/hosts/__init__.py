"""Hosts: what discovery says (the watcher) and what may be used (the registry)."""
