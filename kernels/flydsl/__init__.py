"""FlyDSL backend (gfx950)."""
