"""`EtcdJobQueue`: the durable batch-job queue on etcd, beside the leases (key ``PREFIX job/<id>``).

Role: the same methods and semantics as the SQLite ``BatchJobQueue`` (``gpupool.adapters.batch.queue``;
both keep the core's `gpupool.core.tidal.jobs.JobRecord`), so that a new leader
finds every queued, running and paused job where the old one left them.

Invariants:
- one key per job, its value the JSON of the spec and its state fields;
- every change is a compare-and-set on the key's ``mod_revision`` (an etcd Txn): `claim` moves a
  QUEUED job to RUNNING for exactly one caller among any number of replicas; `transition` checks
  the move with `gpupool.core.tidal.jobs.check_transition` against the state it read and writes only
  if nobody changed the job since (else it reads again and checks again); a refused move changes
  nothing;
- the store's fence (`EtcdLeaseStore.set_fence`) applies to job writes too;
- `jobs(QUEUED)` is in the core's queue order (`queue_key`: deadline, submission time, id);
- a value that is not a job (a hand edit) raises `JobValueDamaged` naming the key and the job
  (answered 503, never 500); ``jobs(damaged=...)`` skips it instead and names it there.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from gpupool.adapters.fastjson import dumps
from gpupool.adapters.store.etcd import EtcdLeaseStore, NotLeader
from gpupool.adapters.store.etcd_client import KeyValue, compare, prefix_end, put_op, range_op
from gpupool.core.errors import DuplicateId, StoreDamaged, UnknownId
from gpupool.core.tidal.jobs import (
    BatchJobSpec,
    JobRecord,
    JobState,
    check_transition,
    queue_key,
    spec_from_dict,
    validate_job,
)

MAX_CAS_TRIES = 100


def _encode(rec: JobRecord, updated_at: float) -> bytes:
    d = asdict(rec)
    d["state"] = rec.state.value
    d["updated_at"] = updated_at
    return dumps(d, sort_keys=True)


class JobValueDamaged(StoreDamaged):
    """A ``job/`` value that is not a job; the message names the key, the job and the problem."""

    def __init__(self, key: bytes, job_id: str, problem: str) -> None:
        super().__init__(
            f"batch queue in etcd is damaged (key {key.decode(errors='replace')!r}, job {job_id!r}: "
            f"{problem}); fix or delete that key with etcdctl"
        )


def _decode(key: bytes, job_id: str, value: bytes) -> JobRecord:
    """The `JobRecord` of one value; `JobValueDamaged` when it is not one."""
    try:
        d = json.loads(value)
        return JobRecord(
            spec=spec_from_dict(d["spec"]),
            state=JobState(d["state"]),
            submitted_at=float(d["submitted_at"]),
            attempts=int(d["attempts"]),
            lease_id=str(d["lease_id"]),
            worker=str(d["worker"]),
            reason=str(d["reason"]),
            returncode=None if d["returncode"] is None else int(d["returncode"]),
        )
    except (TypeError, ValueError, KeyError) as exc:  # (json's and the dataclass's refusals)
        raise JobValueDamaged(key, job_id, f"{type(exc).__name__}: {exc}") from None


class EtcdJobQueue:
    def __init__(self, store: EtcdLeaseStore) -> None:
        self.store = store
        self.client = store.client

    def close(self) -> None:
        """The queue shares the store's client: closing the store closes it."""

    def _key(self, job_id: str) -> bytes:
        return self.store.prefix + b"job/" + job_id.encode()

    def _read(self, job_id: str) -> tuple[JobRecord, KeyValue]:
        kvs, _ = self.client.range(self._key(job_id))
        if not kvs:
            raise UnknownId("job", job_id)
        return _decode(kvs[0].key, job_id, kvs[0].value), kvs[0]

    def _cas(self, kv: KeyValue | None, key: bytes, value: bytes) -> bool:
        """Write ``value`` if the key is still as read (``kv`` None: still absent); fenced."""
        fence = self.store._fence
        check = compare(key, "VERSION", 0) if kv is None else compare(key, "MOD", kv.mod_revision)
        ok, responses, _ = self.client.txn([check, *fence], [put_op(key, value)], [range_op(key)])
        if ok:
            return True
        kvs = responses[0].get("response_range", {}).get("kvs", ()) if responses else ()
        now_mod = KeyValue.from_json(kvs[0]).mod_revision if kvs else 0
        if (kv is None and not kvs) or (kv is not None and now_mod == kv.mod_revision):
            raise NotLeader(
                "the leader key changed (another replica leads now): the job write was not applied"
            )
        return False

    def submit(self, spec: BatchJobSpec, *, now: float) -> JobRecord:
        validate_job(spec)
        rec = JobRecord(spec, JobState.QUEUED, now, 0, "", "", "", None)
        if not self._cas(None, self._key(spec.id), _encode(rec, now)):
            raise DuplicateId("id", spec.id)
        return rec

    def get(self, job_id: str) -> JobRecord:
        return self._read(job_id)[0]

    def jobs(
        self, state: JobState | None = None, *, damaged: dict[str, str] | None = None
    ) -> list[JobRecord]:
        """As ``BatchJobQueue.jobs``: a damaged value raises, or with ``damaged`` is skipped, named there."""
        start = self.store.prefix + b"job/"
        kvs, _ = self.client.range(start, prefix_end(start))
        recs = []
        for kv in kvs:
            job_id = kv.key[len(start) :].decode(errors="replace")
            try:
                recs.append(_decode(kv.key, job_id, kv.value))
            except JobValueDamaged as exc:
                if damaged is None:
                    raise
                damaged[job_id] = str(exc)
        return sorted(
            (r for r in recs if state is None or r.state is state),
            key=lambda r: queue_key(r.spec, r.submitted_at),
        )

    def claim(self, job_id: str, *, worker: str, now: float, lease_id: str) -> JobRecord | None:
        """Atomically move QUEUED ``job_id`` to RUNNING under ``lease_id``; None if it is not queued."""
        for _ in range(MAX_CAS_TRIES):
            rec, kv = self._read(job_id)
            if rec.state is not JobState.QUEUED:
                return None
            new = JobRecord(
                rec.spec,
                JobState.RUNNING,
                rec.submitted_at,
                rec.attempts + 1,
                lease_id,
                worker,
                "started",
                None,
            )
            if self._cas(kv, kv.key, _encode(new, now)):
                return new
        return None

    def transition(
        self,
        job_id: str,
        new: JobState,
        *,
        now: float,
        reason: str = "",
        lease_id: str | None = None,
        returncode: int | None = None,
    ) -> JobRecord:
        for _ in range(MAX_CAS_TRIES):
            rec, kv = self._read(job_id)
            check_transition(job_id, rec.state, new)
            fields: dict[str, Any] = {"state": new, "reason": reason}
            if lease_id is not None:
                fields["lease_id"] = lease_id
            if returncode is not None:
                fields["returncode"] = returncode
            if new is JobState.QUEUED:
                fields["worker"] = ""
                fields["lease_id"] = ""
            d = {**{f: getattr(rec, f) for f in JobRecord.__dataclass_fields__}, **fields}
            out = JobRecord(**d)
            if self._cas(kv, kv.key, _encode(out, now)):
                return out
        raise NotLeader(f"job {job_id}: {MAX_CAS_TRIES} concurrent changes in a row; not applied")

    def set_state(
        self,
        job_id: str,
        new: JobState,
        *,
        now: float,
        reason: str = "",
        lease_id: str | None = None,
        returncode: int | None = None,
    ) -> None:
        """`transition` (the SQLite queue's counterpart; a damaged value raises `JobValueDamaged`)."""
        self.transition(job_id, new, now=now, reason=reason, lease_id=lease_id, returncode=returncode)

    def recover(self, *, now: float) -> list[str]:
        """Requeue the RUNNING/PAUSED jobs a previous leader left behind; returns their ids."""
        ids = [r.spec.id for r in self.jobs(damaged={}) if r.state in (JobState.RUNNING, JobState.PAUSED)]
        for job_id in ids:
            self.transition(job_id, JobState.QUEUED, now=now, reason="recovered after restart: requeued")
        return ids


__all__ = ["EtcdJobQueue", "JobRecord", "JobValueDamaged"]
