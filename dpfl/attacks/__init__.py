"""Malicious clients and membership inference (the robust aggregators are `dpfl.schemes.robust`)."""
