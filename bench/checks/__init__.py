"""Acceptance checks on a device: the production shapes against float64, the service end to end."""
