"""The round machine: every decision about rounds, failures and hosts, pure (no I/O, no clock)."""
