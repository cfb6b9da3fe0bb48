"""Where a build's time goes: its phases, timed by the builder where gpuenv has their
boundaries (the probe, the context assembled, the engine's build, the tag) and read from
BuildKit's plain log where the engine has them (`BuildLog`): the context sent, uv fetched
near the engine, uv's own summary lines inside the install steps, the export.

`gpuenv build --json` gives them per cell (`phases`, seconds), in this order:

- probe: whether the engine's host reaches the index (gpuenv/building/near.py; a kept
  verdict costs nothing); it runs while the context is made, so it overlaps `context`;
- context: the resolution, the wheels picked and fetched here, the directory written;
- send: BuildKit's `load build context` (what crosses towards a remote engine);
- uv: uv's wheel fetched near the engine (its script's own line; 0 when uv was sent);
- fetch: uv's `Prepared` lines: the wheels downloaded near the engine and unpacked (only
  unpacked, when they were sent);
- install: the rest of the install steps (linking into the environment, bytecode);
- steps: the other steps (the base, apt, files);
- export: BuildKit's export of the image (layers, the image's config, its load);
- build: the engine's build as a whole, from the build's start to the image's ID;
- tag: tagging the image and reading its size.
"""

from __future__ import annotations

import re

ORDER = ("probe", "context", "send", "uv", "fetch", "install", "steps", "export", "build", "tag")

_VERTEX = re.compile(r"#(\d+) (.*)")
_DONE = re.compile(r"#(\d+) DONE (\d+(?:\.\d+)?)s$")
# uv's summary line, as its `elapsed` writes the time: 300ms, 9.12s, 1m 02s.
_PREPARED = re.compile(
    r"#(\d+) [\d.]+ Prepared \d+ packages? in (?:(\d+)m )?(\d+(?:\.\d+)?)(ms|s)$"
)
_UV_FETCHED = re.compile(
    r"#(\d+) [\d.]+ gpuenv: uv fetched near the engine: .* in (\d+(?:\.\d+)?)s$"
)
_TIMESTAMPED = re.compile(r"#\d+ \d+\.\d+ ")
INSTALL_MARK = "--mount=type=bind,source="


class BuildLog:
    """Fed BuildKit's plain progress lines as they come (`--progress plain`): each vertex's
    name (its first line) and its DONE time, and the install steps' uv lines. Lines of
    another form (the classic builder's, podman's) are ignored: their phases stay 0."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self.done: dict[str, float] = {}
        self.prepared: dict[str, float] = {}
        self.uv: dict[str, float] = {}

    def __call__(self, line: str) -> None:
        line = line.strip()
        done = _DONE.match(line)
        if done:
            self.done[done.group(1)] = float(done.group(2))
            return
        prepared = _PREPARED.match(line)
        if prepared:
            vertex, minutes, value, unit = prepared.groups()
            seconds = float(value) / (1000 if unit == "ms" else 1) + 60 * int(minutes or 0)
            self.prepared[vertex] = self.prepared.get(vertex, 0.0) + seconds
            return
        fetched = _UV_FETCHED.match(line)
        if fetched:
            self.uv[fetched.group(1)] = float(fetched.group(2))
            return
        vertex = _VERTEX.match(line)
        if vertex and vertex.group(1) not in self.names and not _TIMESTAMPED.match(line):
            self.names[vertex.group(1)] = vertex.group(2)

    def phases(self) -> dict[str, float]:
        """send, uv, fetch, install, steps, export: seconds, summed over vertices."""
        out = dict.fromkeys(("send", "uv", "fetch", "install", "steps", "export"), 0.0)
        for vertex, seconds in self.done.items():
            name = self.names.get(vertex, "")
            if name == "[internal] load build context":
                out["send"] += seconds
            elif name.startswith("exporting to") or name in ("sending tarball",):
                out["export"] += seconds
            elif INSTALL_MARK in name:
                uv, fetch = self.uv.get(vertex, 0.0), self.prepared.get(vertex, 0.0)
                out["uv"] += uv
                out["fetch"] += fetch
                out["install"] += max(0.0, seconds - uv - fetch)
            elif name.startswith("[") and not name.startswith("[internal]"):
                out["steps"] += seconds  # "[2/5] RUN ...", "[1/5] FROM ..."
        return out


def ordered(phases: dict[str, float]) -> dict[str, float]:
    """The phases in ORDER, rounded to 10 ms, for --json."""
    return {name: round(phases[name], 2) for name in ORDER if name in phases}
