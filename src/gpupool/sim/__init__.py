"""Trace-driven simulator: drives the real core allocator with the Alibaba GPU trace, no I/O.

Modules: `trace` (loaders), `workload` (target workload, seeded arrival and node order), `mirror`
(vectorised node state), `frag` (FGD's fragmentation measure), `policies` (placement policies),
`engine` (one run through the core), `metrics` (curves, medians), `report` (matrix, table, plots).
numpy is allowed here; the core stays standard-library only.
"""
