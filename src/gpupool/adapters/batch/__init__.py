"""Batch (P2) jobs: the durable SQLite queue (`queue`), the local subprocess executor (`local`,
the default), the optional Ray executor (`ray_executor`, extra ``ray``), and `runner`, which makes
every running job hold a P2 lease on the core allocator and obey pause/resume/preemption."""
