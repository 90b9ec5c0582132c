"""Prometheus metrics (prometheus_client, imported lazily): the gateway's and the agent's pages."""
