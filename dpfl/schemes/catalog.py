"""Registers the compression and DP schemes (imported lazily by the registry)."""
