"""Benchmarks (not unit tests): see bench/README.md."""
