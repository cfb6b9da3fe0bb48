"""What a build says while it waits (gpuenv/building/activity.py, progress.py): a real
build's log (tests/unit/recorded/build-jax-cpu-near.log: the locked JAX CPU cell built
--no-cache, its wheels fetched by the engine's host) read into words and numbers, live on a
terminal and one line per fact, not more often than PROGRESS_EVERY, in a log."""

from __future__ import annotations

import itertools
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpuenv.building import progress
from gpuenv.building.activity import Activity

RECORDED = Path(__file__).parent / "recorded" / "build-jax-cpu-near.log"
LINES = RECORDED.read_text().splitlines()
CONTEXT_LINES = (RECORDED.parent / "build-context-1.5GB.log").read_text().splitlines()
CELL: Any = SimpleNamespace(name="jax", image="test/jax:cpu")


def test_the_recorded_build_is_told_in_words_and_numbers():
    read = Activity()
    said = [fact.text for line in LINES if (fact := read(line))]
    assert not any("sha256" in text for text in said), said
    fetching = [text for text in said if "fetching wheels" in text]
    assert fetching[-1] == (
        "step 2/4 (python-env): fetching wheels: 4 of 6, 127.0 MiB of 127.0 MiB, 28.8 MiB/s"
    )
    assert fetching[1] == "step 2/4 (python-env): fetching wheels: 0 of 6, 0 B of 90.6 MiB"
    assert said[said.index("sending the build context") + 1] == (
        "sent the build context: 38.4 MB in 0.6 s, 64.1 MB/s"
    )
    assert [text for text in said if "fetched" in text or "installed" in text] == [
        "step 2/4 (python-env): fetched 6 wheels, 127.0 MiB in 4.41s, 28.8 MiB/s",
        "step 2/4 (python-env): installed 6 packages in 75ms",
    ]
    assert said[-3:] == [
        "exporting the layers",
        "exported the layers in 4.9 s",
        "writing the image",
    ]


def test_a_context_that_takes_a_while_is_told_as_it_crosses_and_sent_wheels_are_unpacked():
    """BuildKit repeats `transferring context` while an upload lasts (recorded: 1.5 GB sent
    to this machine's engine, as a slow link to a remote one gives it for less); podman's
    build endpoint gives uv's lines without BuildKit's `#N` prefix."""
    read = Activity()
    facts = [fact for line in CONTEXT_LINES if (fact := read(line))]
    assert [(fact.text, fact.ended) for fact in facts] == [
        ("sending the build context", False),
        ("sending the build context: 555.3 MB so far, 106.8 MB/s", False),
        ("sending the build context: 1.1 GB so far, 109.8 MB/s", False),
        ("sent the build context: 1.5 GB in 13.3 s, 112.8 MB/s", True),
        ("step 1/1: COPY big /big", False),
        ("sending the image", False),
        ("sent the image in 8.7 s", True),
    ]
    unprefixed = Activity()
    assert unprefixed("Resolved 30 packages in 2ms") is not None
    unpacked = unprefixed("Prepared 30 packages in 1m 02s")
    assert unpacked is not None and unpacked.text == "installing: unpacked 30 wheels in 1m 02s"
    assert unpacked.live == "installing: unpacked 30 wheels in 1m 02s; installing"


def _replay(reporter: progress.ConsoleReporter, now: list[float]) -> None:
    """The recorded lines, one every half second of the fake clock."""
    reporter.started(CELL)
    for line in LINES:
        now[0] += 0.5
        reporter.log(CELL, line)


def test_without_a_terminal_each_fact_is_one_line_and_progress_comes_every_few_seconds(
    capsys: pytest.CaptureFixture[str],
):
    now = [0.0]
    _replay(progress.ConsoleReporter(clock=lambda: now[0], terminal=False), now)
    printed = capsys.readouterr().err.splitlines()
    said = [line.split(": ", 1)[1] for line in printed if line.startswith("    jax: ")]
    assert "step 2/4 (python-env): fetched 6 wheels, 127.0 MiB in 4.41s, 28.8 MiB/s" in said
    assert "step 2/4 (python-env): installed 6 packages in 75ms" in said
    assert "sent the build context: 38.4 MB in 0.6 s, 64.1 MB/s" in said
    # Nine reports of the fetch came in 4.5 s of the clock: one line, not nine.
    assert len([text for text in said if "fetching wheels" in text]) == 1, said
    assert len(printed) == len(set(printed)) and len(printed) <= 16, printed


def test_progress_lines_are_as_frequent_as_the_clock_allows():
    """The same log at a slower pace: a progress line at most every PROGRESS_EVERY, a
    phase's last word whenever it comes."""
    now = [0.0]
    reporter = progress.ConsoleReporter(clock=lambda: now[0], terminal=False)
    printed: list[tuple[float, str]] = []
    reporter._print = lambda text, markup=None: printed.append((now[0], text))  # type: ignore[method-assign]
    reporter.started(CELL)
    for line in LINES:
        now[0] += progress.PROGRESS_EVERY / 3
        reporter.log(CELL, line)
    facts = [(at, text) for at, text in printed if text.startswith("    jax: ") and "#" not in text]
    fetching = [text for _, text in facts if "fetching wheels" in text]
    assert len(fetching) >= 2, facts  # of nine reports, one every PROGRESS_EVERY / 3
    for (before, _), (at, text) in itertools.pairwise(facts):
        if "fetching wheels" in text:
            assert at - before >= progress.PROGRESS_EVERY, (before, at, text)


def test_a_terminal_line_says_the_latest_fact_never_a_hash():
    now = [0.0]
    reporter = progress.ConsoleReporter(clock=lambda: now[0], terminal=False)
    shown: list[str] = []
    reporter.live = SimpleNamespace(update=lambda _table: shown.append(reporter.current["jax"]))
    _replay(reporter, now)
    assert shown and not any("sha256" in line or line.startswith("#") for line in shown), shown
    assert (
        "step 2/4 (python-env): compiled 2141 files' bytecode in 11.39s; finishing the step"
        in shown
    )
    # The python-env step's command asks uv to compile, so that is what comes after.
    assert "step 2/4 (python-env): installed 6 packages in 75ms; compiling bytecode" in shown


def test_a_terminal_line_that_waits_counts_its_seconds():
    """uv says nothing while one wheel downloads: the line says how long it has waited."""
    import io

    from rich.console import Console

    now = [0.0]
    reporter = progress.ConsoleReporter(clock=lambda: now[0], terminal=False)
    reporter.live = SimpleNamespace(update=lambda _table: None)  # rich's Live, not started
    reporter.started(CELL)
    for line in LINES[: LINES.index("#6 0.753 Downloading scipy (33.7MiB)") + 1]:
        reporter.log(CELL, line)

    def shown() -> str:
        out = io.StringIO()
        Console(file=out, width=200).print(reporter._render())
        return out.getvalue().strip()

    fetching = "step 2/4 (python-env): fetching wheels: 0 of 6, 0 B of 127.0 MiB"
    assert shown() == f"⠿ jax {fetching}"
    now[0] += 42.4
    assert shown() == f"⠿ jax {fetching} (42 s)"
