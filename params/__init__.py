"""Registered experiments (see tensorpipe/model_registry.py)."""
