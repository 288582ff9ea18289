"""Triton backend (H200 path); see scoring.py."""
