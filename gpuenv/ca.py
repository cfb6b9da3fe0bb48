"""The CA bundle pip and uv trust during a build, and the loopback server that hands it over.

Corporate proxies intercept TLS, so the build's install step must trust their CA. It must
also never keep it: not in a layer, not in the history (build args land there), not in the
config. gpuenv serves the bundle on 127.0.0.1 for the length of the build; the install step
(builds use host networking) fetches it, uses it and deletes it before the layer is saved.
"""

from __future__ import annotations

import os
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType

from gpuenv.errors import GpuenvError
from gpuenv.render import CA_PORT, CA_URL


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

    Two gpuenv builds may run at once; the second finds the port taken and reuses the
    first's server when it serves the same bundle.
    """

    def __init__(self, bundle: Path) -> None:
        self.data = bundle.read_bytes()
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

        try:
            self._server = ThreadingHTTPServer(("127.0.0.1", CA_PORT), Handler)
        except OSError:
            if self._serving_same():
                return self
            raise GpuenvError(
                f"port {CA_PORT} on 127.0.0.1 is taken by something else; gpuenv serves the "
                "build's CA bundle there. Stop that process and build again"
            ) from None
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def _serving_same(self) -> bool:
        try:
            with urllib.request.urlopen(CA_URL, timeout=2) as reply:
                return bool(reply.read() == self.data)
        except OSError:
            return False

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
