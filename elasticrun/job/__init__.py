"""The job's definition: its settings (DriverConfig), the errors elasticrun raises on
purpose, the operator's secrets, the state directory, and plugin specs. Imports nothing of
elasticrun but itself: every other part of the package may use it."""
