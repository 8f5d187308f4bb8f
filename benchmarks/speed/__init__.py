"""See benchmarks/README.md."""
