"""Writes of the fleet app. Each function does one thing in a transaction, audits it and publishes events."""
