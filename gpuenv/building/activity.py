"""What a build is doing now, in words and numbers, read from the engine's own log.

BuildKit's plain progress names a step by its hash and its Dockerfile line, and is silent
about what happens inside a long RUN. The install steps' uv is not silenced
(gpuenv/building/render.py: `--no-progress` drops only the bars), so without a terminal
it prints its own facts, which this module reads (uv 0.13.9's forms, recorded in
tests/unit/recorded/build-jax-cpu-near.log):

- `Resolved 6 packages in 152ms`: the step's requirements, the lock's lines for that step
  (it installs with --no-deps and hashes, so uv resolves nothing more: M);
- `Downloading jaxlib (74.5MiB)`, ` Downloaded jaxlib`: uv announces the larger wheels only,
  with their size, when their download starts (all at once: they run concurrently) and ends;
- `Prepared 6 packages in 4.41s`: every wheel fetched (or, when sent, unpacked);
- `Installed 6 packages in 75ms`, `Bytecode compiled 2141 files in 11.39s`.

And BuildKit's own: `transferring context: 38.44MB 0.6s` of `[internal] load build context`
(what crosses towards the engine; repeated about every 5 s while it lasts, `done` at the
end: tests/unit/recorded/build-context-1.5GB.log), `exporting layers`, `sending tarball`.
A line of the classic builder's or podman's form (no `#N` prefix) is read the same.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpuenv.building.phases import INSTALL_MARK

# "#6 5.152 rest": BuildKit's vertex and the seconds since the step began; "#6 rest" without.
_PREFIX = re.compile(r"#(\d+) (?:(\d+\.\d+) )?")
_STEP = re.compile(r"\[(?:[^\]\s]+ )?(\d+)/(\d+)\] (\S+)(.*)")
_CONTEXT = re.compile(r"transferring context: (\d+(?:\.\d+)?)([kMG]?B) (\d+(?:\.\d+)?)s( done)?$")
_RESOLVED = re.compile(r"Resolved (\d+) packages? in ")
_DOWNLOADING = re.compile(r"Downloading (\S+) \((\d+(?:\.\d+)?)([KMG]i)?B\)$")
_DOWNLOADED = re.compile(r"Downloaded (\S+)$")
_PREPARED = re.compile(r"Prepared (\d+) packages? in (.+)$")
_INSTALLED = re.compile(r"Installed (\d+) packages? in (.+)$")
_COMPILED = re.compile(r"Bytecode compiled (\d+) files? in (.+)$")
_UV_NEAR = re.compile(r"gpuenv: (uv fetched near the engine: .*)$")
_EXPORT_DONE = re.compile(r"exporting layers (\d+(?:\.\d+)?)s done$")
_TARBALL_DONE = re.compile(r"sending tarball (\d+(?:\.\d+)?)s done$")

# BuildKit sizes its transfers in decimal units (go-units' HumanSize); uv in binary ones.
_DECIMAL = {"B": 1, "kB": 10**3, "MB": 10**6, "GB": 10**9}
_BINARY = {None: 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}


@dataclass(frozen=True)
class Fact:
    """One thing to tell the user. `ended`: a phase's last word (its totals), which a log
    keeps; otherwise a progress report, which the next one replaces. `then`: what a live
    line says after it, until the next fact (the step goes on silently)."""

    text: str
    ended: bool = False
    then: str = ""

    @property
    def live(self) -> str:
        """The cell's one line on a terminal."""
        return f"{self.text}; {self.then}" if self.then else self.text


@dataclass
class _Wheels:
    """One install step's uv: what it resolved, announced and has finished fetching."""

    resolved: int = 0
    sizes: dict[str, int] = field(default_factory=dict)
    fetched: set[str] = field(default_factory=set)
    began: float | None = None  # the step's clock at the first Downloading


def mib(size: float) -> str:
    """Bytes as uv writes them (binary units)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size:.0f} B"


def megabytes(size: float) -> str:
    """Bytes as docker writes its transfers (decimal units)."""
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size:.0f} B"


class Activity:
    """One cell's build, fed its log line by line; each call returns what to say now, or
    None when the line changes nothing the user is told."""

    def __init__(self) -> None:
        self.steps: dict[str, str] = {}  # vertex -> "step 2/4 (python-env)"
        self.context: str | None = None  # the vertex that loads the build context
        self.wheels: dict[str, _Wheels] = {}
        self.compiling: set[str] = set()  # install steps whose uv compiles after installing

    def __call__(self, line: str) -> Fact | None:
        line = line.strip()
        prefix = _PREFIX.match(line)
        vertex, clock = (prefix.group(1), prefix.group(2)) if prefix else ("", None)
        rest = line[prefix.end() :] if prefix else line
        if prefix and clock is None and vertex not in self.steps and vertex != self.context:
            return self._vertex(vertex, rest)
        if clock is None and vertex == self.context:
            return self._sending(rest)
        return self._uv(vertex, float(clock) if clock else None, rest.strip()) or (
            self._exporting(rest)
        )

    def _vertex(self, vertex: str, name: str) -> Fact | None:
        """A vertex's first line: its name."""
        if name == "[internal] load build context":
            self.context = vertex
            return Fact("sending the build context")
        step = _STEP.match(name)
        if not step:
            return self._exporting(name)
        number, total, instruction, args = step.groups()
        label = f"step {number}/{total}"
        part = re.search(r"--mount=type=bind,source=([^,\s]+)", args)
        if INSTALL_MARK in args and part:
            self.steps[vertex] = f"{label} ({part.group(1)})"
            if "--compile-bytecode" in args:  # the step's whole command is its name
                self.compiling.add(vertex)
            return Fact(f"{self.steps[vertex]}: installing")
        self.steps[vertex] = label
        return Fact(f"{label}: {instruction} {args.strip()}"[:80])

    def _sending(self, rest: str) -> Fact | None:
        sent = _CONTEXT.match(rest)
        if not sent:
            return None
        value, unit, seconds, done = sent.groups()
        size, elapsed = float(value) * _DECIMAL[unit], float(seconds)
        rate = f", {megabytes(size / elapsed)}/s" if elapsed > 0 else ""
        if done:
            return Fact(f"sent the build context: {megabytes(size)} in {elapsed:.1f} s{rate}", True)
        return Fact(f"sending the build context: {megabytes(size)} so far{rate}")

    def _uv(self, vertex: str, clock: float | None, rest: str) -> Fact | None:
        step = self.steps.get(vertex, "installing")
        wheels = self.wheels.setdefault(vertex, _Wheels())
        if m := _UV_NEAR.match(rest):
            return Fact(f"{step}: {m.group(1)}", True)
        if m := _RESOLVED.match(rest):
            wheels.resolved = int(m.group(1))
            return Fact(f"{step}: preparing {wheels.resolved} wheels")
        if m := _DOWNLOADING.match(rest):
            wheels.sizes[m.group(1)] = round(float(m.group(2)) * _BINARY[m.group(3)])
            if wheels.began is None:
                wheels.began = clock
            return Fact(f"{step}: {self._fetching(wheels, clock)}")
        if m := _DOWNLOADED.match(rest):
            wheels.fetched.add(m.group(1))
            return Fact(f"{step}: {self._fetching(wheels, clock)}")
        if m := _PREPARED.match(rest):
            count, took = m.groups()
            if not wheels.sizes:
                return Fact(f"{step}: unpacked {count} wheels in {took}", True, "installing")
            total = sum(wheels.sizes.values())
            seconds = _seconds(took)
            rate = f", {mib(total / seconds)}/s" if seconds > 0 else ""
            fetched = f"{step}: fetched {count} wheels, {mib(total)} in {took}{rate}"
            return Fact(fetched, True, "installing")
        if m := _INSTALLED.match(rest):
            installed = f"{step}: installed {m.group(1)} packages in {m.group(2)}"
            then = "compiling bytecode" if vertex in self.compiling else "finishing the step"
            return Fact(installed, True, then)
        if m := _COMPILED.match(rest):
            compiled = f"{step}: compiled {m.group(1)} files' bytecode in {m.group(2)}"
            return Fact(compiled, True, "finishing the step")
        return None

    @staticmethod
    def _fetching(wheels: _Wheels, clock: float | None) -> str:
        """fetching wheels: 2 of 6, 18.8 of 127.0 MiB, 6.1 MiB/s. The count and bytes done
        are the announced (larger) wheels finished; the total bytes are those announced."""
        total = sum(wheels.sizes.values())
        done = sum(wheels.sizes[name] for name in wheels.fetched if name in wheels.sizes)
        of = f" of {wheels.resolved}" if wheels.resolved else ""
        text = f"fetching wheels: {len(wheels.fetched)}{of}, {mib(done)} of {mib(total)}"
        if clock is not None and wheels.began is not None and clock > wheels.began and done:
            text += f", {mib(done / (clock - wheels.began))}/s"
        return text

    @staticmethod
    def _exporting(rest: str) -> Fact | None:
        rest = rest.strip()
        if m := _EXPORT_DONE.match(rest):
            return Fact(f"exported the layers in {float(m.group(1)):.1f} s", True)
        if rest == "exporting layers":
            return Fact("exporting the layers")
        if rest.startswith("writing image "):
            return Fact("writing the image")
        if m := _TARBALL_DONE.match(rest):
            return Fact(f"sent the image in {float(m.group(1)):.1f} s", True)
        if rest.startswith("sending tarball"):
            return Fact("sending the image")
        return None


def _seconds(took: str) -> float:
    """uv's elapsed time (300ms, 9.12s, 1m 02s) in seconds."""
    m = re.fullmatch(r"(?:(\d+)m )?(\d+(?:\.\d+)?)(ms|s)", took)
    if not m:
        return 0.0
    minutes, value, unit = m.groups()
    return float(value) / (1000 if unit == "ms" else 1) + 60 * int(minutes or 0)
