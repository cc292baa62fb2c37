"""Operating a job: the webhook, /status, /metrics, events and failure reports."""
