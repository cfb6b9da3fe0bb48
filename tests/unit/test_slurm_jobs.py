"""Slurm's outputs, as gpuenv/run/slurm/jobs.py reads them, on outputs recorded from the lab
cluster (tests/unit/recorded/README.md, "Slurm"); following a job (gpuenv/run/slurm/run.py)
against a stand-in for Slurm's commands that replays recorded states."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from gpuenv.run.slurm import SlurmError
from gpuenv.run.slurm import run as slurm_run
from gpuenv.run.slurm.jobs import (
    Job,
    Slurm,
    job_from,
    lost_nodes,
    parse_show_job,
    parse_submitted,
    refusal,
)

RECORDED = Path(__file__).parent / "recorded" / "slurm"


def recorded(name: str) -> str:
    return (RECORDED / name).read_text()


def job(name: str) -> Job:
    return job_from(parse_show_job(recorded(name)))


def test_fields_with_spaces_and_equals_signs():
    fields = parse_show_job(recorded("scontrol-show-job-pending-resources.txt"))
    assert fields["JobName"] == "name with space"
    assert fields["TRES"] == "cpu=2,mem=4000M,node=2,billing=2"
    assert fields["AllocNode:Sid"] == "localhost:14389"
    assert fields["TresPerNode"] == "gres:gpu:4"
    assert fields["Power"] == ""


@pytest.mark.parametrize(
    ("name", "state", "reason", "code", "sig", "ended"),
    [
        ("scontrol-show-job-pending-resources.txt", "PENDING", "Resources", 0, 0, False),
        ("scontrol-show-job-running.txt", "RUNNING", "None", 0, 0, False),
        ("scontrol-show-job-completing.txt", "COMPLETING", "None", 0, 0, False),
        ("scontrol-show-job-cancelled.txt", "CANCELLED", "None", 0, 15, True),
        ("scontrol-show-job-failed-exit5.txt", "FAILED", "NonZeroExitCode", 5, 0, True),
        ("scontrol-show-job-signal9.txt", "FAILED", "JobLaunchFailure", 0, 9, True),
        ("scontrol-show-job-completed.txt", "COMPLETED", "None", 0, 0, True),
    ],
)
def test_recorded_states(name, state, reason, code, sig, ended):
    j = job(name)
    assert (j.state, j.reason, j.exit_code, j.signal, j.ended) == (state, reason, code, sig, ended)


def test_running_job_names_its_nodes():
    assert job("scontrol-show-job-running.txt").nodes == "n[1-2]"


def test_pending_reason_in_words():
    words = job("scontrol-show-job-pending-resources.txt").reason_words()
    assert words == "waiting for resources (nodes or GPUs in use by other jobs) (Resources)"
    assert Job("1", "PENDING", reason="SomethingNew").reason_words() == "SomethingNew"


def test_exit_codes_of_ended_jobs():
    assert slurm_run.exit_code(job("scontrol-show-job-failed-exit5.txt")) == 5
    assert slurm_run.exit_code(job("scontrol-show-job-completed.txt")) == 0
    assert slurm_run.exit_code(job("scontrol-show-job-signal9.txt")) == 137
    assert slurm_run.exit_code(Job("7", "TIMEOUT", signal=15)) == 124
    with pytest.raises(SlurmError, match="job 19 was cancelled") as exc:
        slurm_run.exit_code(job("scontrol-show-job-cancelled.txt"))
    assert exc.value.exit_code == 125


def test_the_lost_node_is_named():
    """A node whose slurmd died (the lab's, recorded): named with Slurm's reason; the
    other, idle, is not."""
    assert lost_nodes(recorded("scontrol-show-node-n2-down.txt")) == ["n2 (Not responding)"]
    lost = Job("4", "NODE_FAIL", nodes="n[1-2]")
    with pytest.raises(SlurmError) as exc:
        slurm_run.exit_code(lost, ["n2 (Not responding)"])
    assert exc.value.message == "job 4 failed: Slurm lost node n2 (Not responding) of n[1-2]"
    assert exc.value.exit_code == 125
    with pytest.raises(SlurmError, match=r"job 4 lost a node \(n\[1-2\]\)"):
        slurm_run.exit_code(lost)  # Slurm holds no node down (any more): the job's nodes


def test_sbatch_refusals_in_one_line():
    assert refusal(recorded("sbatch-gpus-per-node-5.stderr")) == (
        "Requested node configuration is not available"
    )
    assert refusal(recorded("sbatch-test-only-refused.txt")) == (
        "Requested node configuration is not available"
    )


def test_submitted_job_id():
    assert parse_submitted("42\n") == "42"
    assert parse_submitted("42;cluster2\n") == "42"
    with pytest.raises(SlurmError, match="not a job ID"):
        parse_submitted("sbatch: error: ...")


def test_no_slurm_on_path(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(SlurmError, match=r"^slurm run: sbatch, scontrol, scancel not found"):
        Slurm.find()


# ---------------------------------------------------------------------- following a job


class Replay(Slurm):
    """scontrol's answers, one per call (the last repeats); output appended as it goes."""

    def __init__(self, states: list[Job | None], out: Path, lines: dict[int, bytes]) -> None:
        super().__init__({})
        self.states, self.out, self.lines, self.calls, self.cancelled = states, out, lines, 0, 0

    def job(self, job_id: str) -> Job | None:
        if self.calls in self.lines:
            with self.out.open("ab") as fh:
                fh.write(self.lines[self.calls])
        state = self.states[min(self.calls, len(self.states) - 1)]
        self.calls += 1
        return state

    def cancel(self, job_id: str) -> None:
        self.cancelled += 1
        self.states = [Job(job_id, "CANCELLED", signal=15)]
        self.calls = 0


def test_follow_prints_reasons_output_and_exits_with_the_jobs_code(tmp_path, capsys):
    out = tmp_path / "gpuenv-3.out"
    pending = job("scontrol-show-job-pending-resources.txt")
    running = job("scontrol-show-job-running.txt")
    failed = job("scontrol-show-job-failed-exit5.txt")
    replay = Replay([pending, pending, running, running, failed], out,
                    {2: b"n1 hello\n", 3: b"n2 hello\n"})  # fmt: skip
    sink = io.BytesIO()
    assert slurm_run.follow(replay, "3", out, sink, sleep=lambda s: None) == 5
    assert sink.getvalue() == b"n1 hello\nn2 hello\n"
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "gpuenv: job 3 pending: waiting for resources (nodes or GPUs in use by other jobs) "
        "(Resources)",
        "gpuenv: job 3 running on n[1-2]",
    ]


def test_a_job_that_can_never_start_is_cancelled(tmp_path):
    never = Job("4", "PENDING", reason="PartitionTimeLimit")
    replay = Replay([never], tmp_path / "o", {})
    with pytest.raises(SlurmError, match="job 4 can never start: a longer --time"):
        slurm_run.follow(replay, "4", tmp_path / "o", io.BytesIO(), sleep=lambda s: None)
    assert replay.cancelled == 1


def test_completing_is_not_the_end(tmp_path):
    """A cancelled job shows COMPLETING while its processes are still being ended: gpuenv
    waits for CANCELLED (no task process left) before it returns."""
    completing = job("scontrol-show-job-completing.txt")
    replay = Replay([completing, completing, job("scontrol-show-job-completed.txt")],
                    tmp_path / "o", {})  # fmt: skip
    assert slurm_run.follow(replay, "27", tmp_path / "o", io.BytesIO(), sleep=lambda s: None) == 0
    assert replay.calls == 3


def test_interrupt_cancels_and_waits(tmp_path, capsys):
    running = job("scontrol-show-job-running.txt")
    replay = Replay([running], tmp_path / "o", {})
    calls = []

    def interrupt(seconds: float) -> None:
        calls.append(seconds)
        if len(calls) == 2:
            raise KeyboardInterrupt

    assert slurm_run.attach(replay, "19", tmp_path / "o", sleep=interrupt) == 130
    assert replay.cancelled == 1
    assert "gpuenv: cancelled job 19" in capsys.readouterr().err
