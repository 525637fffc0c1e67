"""Logging, metric sinks, terminal output and speed measurement."""
