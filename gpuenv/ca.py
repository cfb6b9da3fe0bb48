"""The CA bundle pip and uv trust during a build, and the loopback server that hands it over.

Corporate proxies intercept TLS, so the build's install step must trust their CA. It must
also never keep it: not in a layer, not in the history (build args land there), not in the
config. gpuenv serves the bundle on 127.0.0.1 for the length of the build; the install step
(builds use host networking) fetches it, uses it and deletes it before the layer is saved.
"""

from __future__ import annotations

import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any

from gpuenv.contract import CA_PORT
from gpuenv.errors import GpuenvError


def find_bundle(explicit: Path | None, matrix_value: str | None, matrix_dir: Path) -> Path | None:
    """The first of --ca-bundle, the matrix's build.ca_bundle, $GPUENV_CA_BUNDLE, $PIP_CERT."""
    if explicit is not None:
        candidate, origin = explicit, "--ca-bundle"
    elif matrix_value:
        candidate, origin = matrix_dir / matrix_value, "build.ca_bundle"
    elif os.environ.get("GPUENV_CA_BUNDLE"):
        candidate, origin = Path(os.environ["GPUENV_CA_BUNDLE"]), "$GPUENV_CA_BUNDLE"
    elif os.environ.get("PIP_CERT"):
        candidate, origin = Path(os.environ["PIP_CERT"]), "$PIP_CERT"
    else:
        return None
    try:
        text = candidate.read_bytes()
    except OSError as exc:
        raise GpuenvError(f"CA bundle {candidate} (from {origin}): {exc.strerror}") from None
    if b"-----BEGIN CERTIFICATE-----" not in text:
        raise GpuenvError(f"CA bundle {candidate} (from {origin}) holds no PEM certificate")
    return candidate


class CAServer:
    """Serves one file at CA_URL while the context is open.

    The port is fixed (the RUN line must stay byte-identical for the cache), so two gpuenv
    builds on one machine take turns: the second waits until the first releases the port.
    Borrowing the first one's server would break when that build ends mid-way through ours.
    """

    def __init__(self, bundle: Path, wait_seconds: float = 1800, say: Any = None) -> None:
        self.data = bundle.read_bytes()
        self.wait_seconds = wait_seconds
        self.say = say or (lambda message: None)
        self._server: ThreadingHTTPServer | None = None

    def __enter__(self) -> CAServer:
        data = self.data

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path != "/ca.pem":
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                pass

        deadline = time.monotonic() + self.wait_seconds
        waited = False
        while True:
            try:
                self._server = ThreadingHTTPServer(("127.0.0.1", CA_PORT), Handler)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise GpuenvError(
                        f"port {CA_PORT} on 127.0.0.1 stayed taken; gpuenv serves the build's "
                        "CA bundle there. Stop what holds it (another gpuenv build?) and retry"
                    ) from None
                if not waited:
                    self.say(f"waiting for 127.0.0.1:{CA_PORT} (another gpuenv build holds it)")
                    waited = True
                time.sleep(0.5)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
