"""Reanalysis: workers that search stored steps again with the newest network and refresh their targets."""
