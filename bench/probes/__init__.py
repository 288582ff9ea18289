"""Live probes: experiments on the current kernels (bench/README.md says which question each answers)."""
