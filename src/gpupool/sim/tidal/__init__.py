"""Tidal time-sharing simulation (issue 8): 7 days, three strategies, one honest performance model."""
