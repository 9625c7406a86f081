"""Registered experiments of image (see tensorpipe/model_registry.py)."""
