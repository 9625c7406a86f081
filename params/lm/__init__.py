"""Registered experiments of lm (see tensorpipe/model_registry.py)."""
