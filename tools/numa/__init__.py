"""NUMA / memory placement tools (bandwidth probe: python -m tools.numa.bandwidth)."""
