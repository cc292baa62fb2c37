"""Asking for a job below the command line: `elasticrun.run(func)` from Python, and the
assembly both it and the CLI use (job_config: values -> a DriverConfig with its discovery
and launcher plugins)."""
