"""Malicious clients, robust aggregation and membership inference."""
