"""Worker processes: where they run, starting and stopping them, their output."""
