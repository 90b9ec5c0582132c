"""Fixtures for the agent tests: real child processes and a cgroup v2 directory (`tests.child_jobs`)."""

from __future__ import annotations

from tests.child_jobs import batch_job, job_cgroup

__all__ = ["batch_job", "job_cgroup"]
