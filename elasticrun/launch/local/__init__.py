"""Workers on this machine: subprocesses, forked from a worker template, or under local
agents that outlive a lost driver."""
