"""Where a build's public wheels come from: the engine's host, when it reaches the index, or
the client's wheelhouse, sent in the build context.

Fetched near the engine, a GPU cell's 3 GB of CUDA wheels never cross the user's link; the
install step still installs exactly the resolution (one hash per requirement, the wheel the
client-side path would send: gpuenv/building/sendable.py), so the image is the same either
way. Only the matrix's primary index (`build.index_url`, PyPI by default) is fetched near,
and only when it needs no credentials: credentials, a site CA and private indexes' packages
never leave the client, and those wheels keep travelling in the context.

Decided per engine (`decide`), in this order: `--offline` sends everything;
`GPUENV_NEAR_FETCH=client` or `engine` forces a path; podman's build endpoint is always
sent to (not shown with a near fetch); otherwise a probe: a tiny container of the cell's
base on the engine, network host, fetching the index's root with the trust the install
step would have. That is uv's own (Mozilla's roots, as certifi carries them) on a remote
engine; on an engine of this machine (a Unix socket) it is the CA bundle, which the step
then gets as a BuildKit secret (never in a layer, and it does not leave this machine). The
verdict is kept per engine, index and trust for a day (`gpuenv doctor` probes anew).
`GPUENV_NEAR_INDEX=URL` names the index the engine's host fetches from instead (a mirror
near the GPU box, such as a devpi or Artifactory it reaches); it stands for the primary
index and must carry the same files (the hashes are checked).

uv, the installer the steps run, is one of those public wheels: where the host of another
machine's engine fetches and the primary index offers uv's wheel, the step's part holds
`uv_script`'s text instead of uv's executable (17 MB of wheel, 40 MB unpacked, that would
cross the link on every first build; to an engine of this machine uv is sent, a copy on
the same disk). Run by the base's python3, it reads uv's page on the index the host fetches
from, downloads the one wheel the client picked, refuses it unless its sha256 is the one
the client read, and takes the executable out. The image is the same either way.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from gpuenv.matrix.errors import GpuenvError
from gpuenv.store.cache import read_record, update_record

if TYPE_CHECKING:
    from gpuenv.engine.client import Engine
    from gpuenv.store.credentials import Credentials

MODE_ENV = "GPUENV_NEAR_FETCH"  # auto (default) | engine | client
INDEX_ENV = "GPUENV_NEAR_INDEX"  # the index the engine's host fetches from
MODES = ("auto", "engine", "client")
RECORD = "near-fetch.json"  # probe verdicts, a gpuenv cache record
KEEP_SECONDS = 24 * 3600
PROBE_TRUST = "/tmp/gpuenv-trust.pem"
# Run by the base's python3 (no uv, no pip there): the index's root, trusting only the file
# put beside it. An HTTP error (401, 404) counts as unreachable: the step would fail too.
# HEAD first: PyPI's root lists every project (40 MB), which a proxy may fetch whole before
# it answers (0.3-0.8 s here, against 0.08 s for HEAD); GET where HEAD is not served.
PROBE_SCRIPT = f"""\
import ssl, sys, urllib.error, urllib.request
context = ssl.create_default_context(cafile={PROBE_TRUST!r})
def ask(method):
    request = urllib.request.Request(sys.argv[1], method=method,
                                     headers={{"User-Agent": "gpuenv-probe"}})
    with urllib.request.urlopen(request, timeout=10, context=context) as reply:
        reply.read(1024)
        return reply.status
try:
    try:
        status = ask("HEAD")
    except urllib.error.HTTPError as exc:
        if exc.code not in (405, 501):
            raise
        status = ask("GET")
    print("HTTP", status)
except Exception as exc:
    print(type(exc).__name__ + ":", getattr(exc, "reason", exc))
    sys.exit(1)
"""


# Run by the base's python3 in an install step (partials/macros.j2), with the trust the
# step has (SSL_CERT_FILE: the CA secret on an engine of this machine; else the base's
# roots): uv's wheel, found on the index's page by its file name, checked against the
# sha256 the client read, its executable written to argv[1]. Three tries a download.
UV_SCRIPT = """\
import hashlib, html, io, os, re, sys, time, urllib.parse, urllib.request, zipfile
INDEX, FILENAME, SHA256, MEMBER = {index!r}, {filename!r}, {sha256!r}, {member!r}
def get(url, accept="*/*"):
    request = urllib.request.Request(url, headers={{"User-Agent": "gpuenv", "Accept": accept}})
    for attempt in range(3):
        try:
            with urllib.request.urlopen(request, timeout=60) as reply:
                return reply.geturl(), reply.read()
        except Exception as exc:
            problem = exc
            time.sleep(attempt + 1)
    sys.exit(f"gpuenv: cannot fetch {{url}}: {{problem}}")
start = time.monotonic()
page_url, page = get(INDEX + "uv/", "text/html")
for href in re.findall(r'href="([^"]+)"', page.decode("utf-8", "replace")):
    url = urllib.parse.urljoin(page_url, html.unescape(href)).split("#")[0]
    if urllib.parse.unquote(url.rsplit("/", 1)[-1]) == FILENAME:
        break
else:
    sys.exit(f"gpuenv: {{INDEX}}uv/ offers no {{FILENAME}}; the wheels are then sent: "
             "GPUENV_NEAR_FETCH=client")
_, wheel = get(url)
if hashlib.sha256(wheel).hexdigest() != SHA256:
    sys.exit(f"gpuenv: hash mismatch for {{FILENAME}} from {{url}}: not {{SHA256}}; not run")
with zipfile.ZipFile(io.BytesIO(wheel)) as whl:
    executable = whl.read(MEMBER)
with open(os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o755), "wb") as out:
    out.write(executable)
print(f"gpuenv: uv fetched near the engine: {{FILENAME}} ({{len(wheel) / 1e6:.1f}} MB) "
      f"in {{time.monotonic() - start:.2f}}s")
"""


def uv_script(index: str, filename: str, sha256: str, version: str) -> str:
    """The text of the script by which an install step fetches uv's wheel `filename`
    (checked against `sha256`) from `index` and takes out its executable."""
    member = f"uv-{version}.data/scripts/uv"
    return UV_SCRIPT.format(index=_slash(index), filename=filename, sha256=sha256, member=member)


@dataclass(frozen=True)
class Near:
    """The decision for one engine: `index` is the URL the engine's host fetches the
    primary index's wheels from (None: every wheel is sent); `ca` the CA bundle its install
    steps get as a BuildKit secret (an engine of this machine only); `why` says why."""

    index: str | None
    ca: Path | None
    why: str

    def fetches(self, upstream: str, primary: str) -> bool:
        """Whether a wheel the client found on `upstream` is fetched by the engine's host."""
        return self.index is not None and upstream == primary


def _slash(url: str) -> str:
    return url if url.endswith("/") else url + "/"


def near_index(primary: str, credentials: Credentials) -> str | None:
    """The index the engine's host would fetch from: $GPUENV_NEAR_INDEX, else the primary,
    unless that needs credentials (None). It goes to the engine, so it may carry none."""
    if not os.environ.get(INDEX_ENV) and credentials.for_url(primary) is not None:
        return None
    url = os.environ.get(INDEX_ENV, "").strip() or primary
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise GpuenvError(f"{INDEX_ENV}={url!r} is not an index URL; expected http(s)://HOST/...")
    if parts.username or parts.password:
        raise GpuenvError(
            f"{INDEX_ENV} names credentials; they would reach the engine's host: give an "
            "index it reaches without them, or unset it (the wheels are then sent)"
        )
    return _slash(url)


def mode() -> str:
    value = os.environ.get(MODE_ENV, "").strip().lower() or "auto"
    if value not in MODES:
        raise GpuenvError(
            f"{MODE_ENV}={value!r}: expected auto (probe the engine), engine (its host "
            "fetches the public wheels) or client (every wheel is sent from here)"
        )
    return value


def trust(engine: Engine, ca_bundle: Path | None) -> tuple[bytes, Path | None]:
    """What the install step would trust, as PEM, and the CA it would be given: the CA
    bundle on an engine of this machine, else uv's own roots (certifi's Mozilla bundle)."""
    if ca_bundle is not None and engine.is_local:
        return ca_bundle.read_bytes(), ca_bundle
    import certifi

    return Path(certifi.where()).read_bytes(), None


def decide(
    engine: Engine,
    primary: str,
    *,
    image: str,
    ca_bundle: Path | None,
    credentials: Credentials,
    offline: bool,
    fresh: bool = False,
) -> Near:
    """Where the public wheels of builds on `engine` come from (see the module's text).
    `image` runs the probe (a base the engine has); `fresh` probes even when a verdict is
    kept."""
    primary = _slash(primary)
    if offline:
        return Near(None, None, "--offline: every wheel comes from the wheelhouse")
    chosen = mode()
    if chosen == "client":
        return Near(None, None, f"{MODE_ENV}=client: every wheel is sent from here")
    if engine.is_podman:
        return Near(None, None, "podman's builder: every wheel is sent from here")
    index = near_index(primary, credentials)
    if index is None:
        return Near(None, None, f"{primary} needs credentials, which never leave this machine")
    pem, ca = trust(engine, ca_bundle)
    if chosen == "engine":
        return Near(index, ca, f"{MODE_ENV}=engine: the engine's host fetches from {index}")
    ok, detail = probe(engine, index, image, pem, fresh=fresh)
    if ok:
        via = " with the CA bundle as a build secret" if ca else ""
        return Near(index, ca, f"the engine's host reaches {index}{via} (probe: {detail})")
    return Near(None, None, f"the engine's host cannot fetch {index} ({detail}): wheels are sent")


def probe(engine: Engine, index: str, image: str, pem: bytes, *, fresh: bool) -> tuple[bool, str]:
    """(reachable, what the probe said), kept per engine, index and trust for a day."""
    engine_id = str(engine.info().get("ID") or engine.url)
    key = hashlib.sha256(f"{engine_id}\n{index}\n".encode() + pem).hexdigest()[:32]
    kept = read_record(RECORD).get(key)
    now = time.time()
    if not fresh and isinstance(kept, dict) and now - float(kept.get("at", 0)) < KEEP_SECONDS:
        return bool(kept.get("ok")), str(kept.get("detail", ""))
    code, out = engine.run_capture(
        image, ["python3", "-c", PROBE_SCRIPT, index], network="host",
        files={PROBE_TRUST: pem},
    )  # fmt: skip
    detail = " ".join(out.split())[:200] or f"exit {code}"
    update_record(RECORD, {key: {"ok": code == 0, "detail": detail, "at": now}})
    return code == 0, detail
