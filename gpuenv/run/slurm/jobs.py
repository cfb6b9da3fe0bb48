"""Slurm through its own commands on PATH (sbatch, scontrol, scancel), which read
$SLURM_CONF like any other client; their outputs parsed.

`scontrol show job -o` is what follows a job: it works without accounting (slurmdbd), where
`sacct` says accounting is disabled, and carries JobState, Reason and ExitCode=CODE:SIGNAL
(squeue's JSON gives raw wait statuses instead: exit 5 shows as 1280). Slurm forgets a job
MinJobAge seconds (300 by default) after it ended; gpuenv reads it long before that.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass

from gpuenv.run.slurm import SlurmError
from gpuenv.run.slurm.script import WIDENING, submission_environment
from gpuenv.run.slurm.ssh import Login

COMMANDS = ("sbatch", "scontrol", "scancel")
TIMEOUT = 60  # seconds for one command: slurmctld answers in milliseconds, or is down

# States in which the job has ended and no process of it is left on a node (COMPLETING,
# shown while processes are still being ended, is not among them).
ENDED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
                   "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY", "SPECIAL_EXIT"})  # fmt: skip

# Pending reasons in words (squeue(1), JOB REASON CODES).
REASONS = {
    "None": "waiting to be scheduled",
    "Resources": "waiting for resources (nodes or GPUs in use by other jobs)",
    "Priority": "waiting behind jobs of higher priority",
    "Dependency": "waiting for a job it depends on",
    "BeginTime": "waiting for its start time",
    "ReqNodeNotAvail": "a node it needs is down, drained or reserved",
    "NodeDown": "a node it needs is down",
    "JobHeldUser": "held by its user (scontrol release)",
    "JobHeldAdmin": "held by an administrator",
    "Reservation": "waiting for its reservation",
    "QOSMaxGRESPerUser": "the QOS's limit on GPUs per user is reached",
    "AssocGrpGRES": "the account's GPU limit is reached",
    "QOSMaxJobsPerUserLimit": "the QOS's limit on jobs per user is reached",
    "AssocMaxJobsLimit": "the account's limit on jobs is reached",
    "PartitionDown": "the partition is down",
    "PartitionInactive": "the partition is inactive",
}
# Reasons a job keeps until someone changes the cluster's configuration: waiting would be
# forever, so gpuenv cancels the job and says why (exit 125).
NEVER = {
    "BadConstraints": "the request cannot be satisfied by any node",
    "PartitionNodeLimit": "more nodes than the partition allows (--nodes)",
    "PartitionTimeLimit": "a longer --time than the partition allows",
    "PartitionConfig": "the partition's configuration refuses the request",
    "InvalidAccount": "the account is invalid",
    "InvalidQOS": "the QOS is invalid",
    "QOSMaxWallDurationPerJobLimit": "a longer --time than the QOS allows",
}


@dataclass(frozen=True)
class Job:
    """What `scontrol show job -o` says about a job, in the parts gpuenv reads."""

    id: str
    state: str
    reason: str = "None"
    exit_code: int = 0
    signal: int = 0
    nodes: str = ""

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    @property
    def pending(self) -> bool:
        return self.state == "PENDING"

    def reason_words(self) -> str:
        words = REASONS.get(self.reason) or NEVER.get(self.reason)
        return f"{words} ({self.reason})" if words else self.reason


def parse_show_job(text: str) -> dict[str, str]:
    """`scontrol show job -o` (one line per job) of one job as a dict. Values may hold
    spaces (Command=, WorkDir=) and '=' (TRES=cpu=2,node=1): a word starts a new key only
    when it looks like Key=."""
    fields: dict[str, str] = {}
    key = None
    for word in text.strip().split(" "):
        match = re.match(r"([A-Za-z][A-Za-z0-9/:_]*)=(.*)", word)
        if match and (key is None or match.group(1) not in fields):
            key, value = match.groups()
            fields[key] = value
        elif key is not None:
            fields[key] += " " + word
    return fields


def job_from(fields: dict[str, str]) -> Job:
    code, _, sig = fields.get("ExitCode", "0:0").partition(":")
    return Job(
        id=fields.get("JobId", ""),
        state=fields.get("JobState", "UNKNOWN"),
        reason=fields.get("Reason", "None"),
        exit_code=int(code) if code.isdigit() else 0,
        signal=int(sig) if sig.isdigit() else 0,
        nodes=fields.get("NodeList", ""),
    )


def parse_submitted(text: str) -> str:
    """`sbatch --parsable`: JOBID or JOBID;CLUSTER."""
    job_id = text.strip().split(";", 1)[0]
    if not job_id.isdigit():
        raise SlurmError(f"sbatch answered {text.strip()[:200]!r}, not a job ID")
    return job_id


def refusal(stderr: str) -> str:
    """sbatch's reason, without its prefixes: 'sbatch: error: Batch job submission failed:
    Requested node configuration is not available' -> the part after the last colon."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error:" in ln] or lines or ["(no message)"]
    last = errors[-1]
    for prefix in ("error:", "Batch job submission failed:", "allocation failure:"):
        if prefix in last:
            last = last.split(prefix, 1)[1].strip()
    return last


class Slurm:
    """Slurm's commands, found on PATH once, or run on a login node over ssh (`over`)."""

    def __init__(self, paths: dict[str, str], login: Login | None = None) -> None:
        self.paths = paths
        self.login = login

    @classmethod
    def over(cls, login: Login) -> Slurm:
        """The commands on the login node's PATH, each run through the user's ssh."""
        return cls({name: name for name in COMMANDS}, login)

    @classmethod
    def find(cls) -> Slurm:
        paths = {name: shutil.which(name) for name in COMMANDS}
        missing = [name for name, path in paths.items() if path is None]
        if missing:
            raise SlurmError(
                f"slurm run: {', '.join(missing)} not found on PATH: run gpuenv on a login node "
                "of the cluster (Slurm's client commands, with $SLURM_CONF if its "
                "configuration is not in /etc/slurm)"
            )
        return cls({k: v for k, v in paths.items() if v})

    def _run(
        self, name: str, *args: str, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        if self.login is not None:
            return self._run_there(self.login, name, *args, stdin=stdin)
        try:
            return subprocess.run(
                [self.paths[name], *args], input=stdin, capture_output=True, text=True,
                timeout=TIMEOUT, check=False, env=submission_environment(dict(os.environ)),
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            raise SlurmError(
                f"{name} did not answer within {TIMEOUT} s (is slurmctld up?)"
            ) from None
        except OSError as exc:
            raise SlurmError(f"{name}: {exc.strerror or exc}") from None

    def _run_there(
        self, login: Login, name: str, *args: str, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        from gpuenv.run.slurm import ssh

        argv = remote_argv(name, *args)
        proc = ssh.run(login, argv, name, stdin=(stdin or "").encode(), timeout=TIMEOUT,
                       check=False)  # fmt: skip
        if proc.returncode == 127:
            raise SlurmError(
                f"{name} not found on {login.host}: Slurm's client commands must be on the PATH "
                f"of a non-interactive ssh session there (check `ssh {login.who} {name} --version`)"
            )
        return subprocess.CompletedProcess(
            proc.args, proc.returncode, proc.stdout.decode(errors="replace"),
            proc.stderr.decode(errors="replace"),
        )  # fmt: skip

    def submit(self, script: str) -> str:
        proc = self._run("sbatch", "--parsable", stdin=script)
        if proc.returncode != 0:
            raise SlurmError(f"sbatch refused the job: {refusal(proc.stderr)}")
        return parse_submitted(proc.stdout)

    def test_only(self, script: str) -> str:
        """`sbatch --test-only`: where and when the job would start; nothing submitted."""
        proc = self._run("sbatch", "--test-only", stdin=script)
        text = (proc.stderr + proc.stdout).strip()
        if proc.returncode != 0:
            raise SlurmError(f"sbatch refused the job: {refusal(text)} (sbatch --test-only)")
        return text.splitlines()[-1].removeprefix("sbatch: ") if text else "accepted"

    def job(self, job_id: str) -> Job | None:
        """The job as slurmctld knows it; None once it has forgotten it (or never knew)."""
        proc = self._run("scontrol", "show", "job", "-o", job_id)
        if proc.returncode != 0:
            if "Invalid job id" in proc.stderr:
                return None
            raise SlurmError(f"scontrol show job {job_id}: {refusal(proc.stderr)}")
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("JobId=")), "")
        return job_from(parse_show_job(line)) if line else None

    def lost_nodes(self, nodes: str) -> list[str]:
        """Which of `nodes` (a job's NodeList) Slurm holds down, each with its reason."""
        proc = self._run("scontrol", "show", "node", "-o", nodes)
        return lost_nodes(proc.stdout) if proc.returncode == 0 else []

    def cancel(self, job_id: str) -> None:
        proc = self._run("scancel", job_id)
        if proc.returncode != 0:
            raise SlurmError(f"scancel {job_id}: {refusal(proc.stderr)}")


# Node states (scontrol's State=, '+'-joined flags) in which a node has failed the jobs on it.
LOST = ("DOWN", "FAIL", "NOT_RESPONDING")


def lost_nodes(text: str) -> list[str]:
    """From `scontrol show node -o` (one line per node): 'NAME (REASON)' for each node
    that is down or not responding, e.g. ['n2 (Not responding)']."""
    lost = []
    for line in text.splitlines():
        fields = parse_show_job(line)
        if any(flag in LOST for flag in fields.get("State", "").rstrip("*").split("+")):
            reason = re.sub(r" \[[^]]*\]$", "", fields.get("Reason", "")).strip()
            lost.append(f"{fields.get('NodeName', '?')} ({reason or fields['State']})")
    return lost


def remote_argv(name: str, *args: str) -> list[str]:
    """A Slurm command as the login node runs it: without the variables that would widen
    the job's --export (script.py's WIDENING), whatever the session there sets."""
    unset = [a for w in WIDENING for a in ("-u", w)]
    return ["env", *unset, name, *args]


__all__ = ["ENDED", "LOST", "NEVER", "REASONS", "Job", "Slurm", "job_from", "lost_nodes",
           "parse_show_job", "parse_submitted", "refusal", "remote_argv"]  # fmt: skip
