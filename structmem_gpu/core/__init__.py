"""The base layer: errors, stable hashes, table schemas, the run directory, locks, signals,
shared cache segments."""
