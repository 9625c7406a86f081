"""Registered experiments of nmt (see tensorpipe/model_registry.py)."""
