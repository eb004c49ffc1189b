"""Runnable scalar-granular relational models (``python -m examples.gcn``)."""
