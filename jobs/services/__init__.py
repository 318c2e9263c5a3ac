"""Writes of the jobs app, one module per domain; every function runs in a transaction with audit and events."""
