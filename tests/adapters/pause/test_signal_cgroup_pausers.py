"""Signal and cgroup-freezer pausers on real child processes; state checked in /proc and cgroup.events."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from gpupool.adapters.pause import CgroupFreezerPauser, SignalPauser
from gpupool.adapters.pause.procfs import is_stopped, proc_state, process_group
from gpupool.core.clock import ManualClock
from gpupool.core.pausers import Frees, PauseAction, Workload
from tests.child_jobs import wait_for


def test_sigstop_sigcont_on_process_group(batch_job: subprocess.Popen[bytes]) -> None:
    pauser = SignalPauser(clock=ManualClock(5.0))
    assert process_group(batch_job.pid) == batch_job.pid
    w = Workload("L1", "gpu0", "signal", pgid=batch_job.pid)
    assert pauser.frees is Frees.COMPUTE and not pauser.frees.frees_vram
    r = pauser.pause(w)
    assert r.ok and r.action is PauseAction.PAUSE and r.started_at_s == 5.0 and r.latency_ms == 0.0
    assert wait_for(lambda: is_stopped(batch_job.pid))
    assert pauser.is_paused(w)
    assert pauser.resume(w).ok
    assert wait_for(lambda: proc_state(batch_job.pid) in ("S", "R"))
    assert not pauser.is_paused(w)


def test_signal_pauser_confirms_stop_when_asked(batch_job: subprocess.Popen[bytes]) -> None:
    pauser = SignalPauser(confirm_timeout_s=10.0)
    w = Workload("L1", "gpu0", "signal", pids=(batch_job.pid,))
    r = pauser.pause(w)
    assert r.ok, r.reason
    assert is_stopped(batch_job.pid)  # confirmed before pause() returned
    assert pauser.terminate(w).ok
    assert batch_job.wait(timeout=10) != 0


def test_signal_pauser_refuses_the_agent_itself_and_its_parent(batch_job: subprocess.Popen[bytes]) -> None:
    """`check` runs before any signal: these refusals are asserted without sending one."""
    pauser = SignalPauser()
    me, parent = os.getpid(), os.getppid()
    for w in (
        Workload("L1", "gpu0", "signal", pgid=os.getpgrp()),
        Workload("L1", "gpu0", "signal", pgid=me),
        Workload("L1", "gpu0", "signal", pids=(batch_job.pid, me)),
        Workload("L1", "gpu0", "signal", pids=(parent,)),
    ):
        why = pauser.check(w)
        assert why is not None and "refused" in why, w
    assert pauser.check(Workload("L1", "gpu0", "signal", pgid=batch_job.pid)) is None


def test_signal_pauser_refuses_and_reports_vanished_jobs(batch_job: subprocess.Popen[bytes]) -> None:
    pauser = SignalPauser()
    bare = Workload("L2", "gpu0", "signal")
    r = pauser.pause(bare)
    assert not r.ok and r.refused and "pgid" in r.reason
    batch_job.kill()
    batch_job.wait()
    gone = Workload("L3", "gpu0", "signal", pgid=batch_job.pid)
    r = pauser.pause(gone)
    assert not r.ok and not r.refused and "no such process" in r.reason
    assert pauser.terminate(gone).ok  # already gone counts as terminated


def _frozen(cg: Path) -> bool:
    return "frozen 1" in (cg / "cgroup.events").read_text()


def test_cgroup_freezer_freezes_and_thaws(batch_job: subprocess.Popen[bytes], job_cgroup: Path) -> None:
    pauser = CgroupFreezerPauser()
    w = Workload("L4", "gpu0", "cgroup", cgroup=str(job_cgroup))
    assert pauser.check(w) is None
    assert pauser.pause(w).ok
    assert wait_for(lambda: _frozen(job_cgroup))
    assert pauser.is_paused(w)
    # A frozen task parks in the signal-delivery path (state S, wchan get_signal/do_freezer_trap).
    wchan = Path(f"/proc/{batch_job.pid}/wchan").read_text()
    assert wchan in ("get_signal", "do_freezer_trap", "do_signal_stop"), wchan
    assert pauser.resume(w).ok
    assert wait_for(lambda: not _frozen(job_cgroup))
    assert not pauser.is_paused(w)
    assert pauser.terminate(w).ok
    assert batch_job.wait(timeout=10) != 0


def test_cgroup_freezer_refuses_bad_paths(tmp_path: Path) -> None:
    pauser = CgroupFreezerPauser()
    missing = pauser.check(Workload("L", "g", "cgroup"))
    assert missing is not None and "cgroup path" in missing
    relative = pauser.check(Workload("L", "g", "cgroup", cgroup="rel/x"))
    assert relative is not None and "absolute" in relative
    gone = pauser.check(Workload("L", "g", "cgroup", cgroup=str(tmp_path / "no-such-cgroup")))
    assert gone is not None and "cgroup.freeze" in gone
    r = pauser.pause(Workload("L", "g", "cgroup", cgroup=str(tmp_path)))
    assert not r.ok and r.refused and "cgroup.freeze" in r.reason
