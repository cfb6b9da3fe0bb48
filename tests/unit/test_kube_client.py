"""No cluster, a missing context, 401/403, a missing namespace: one `error:` line, exit 125.
Also the code layer's context and the verb's refusals. No cluster and no engine here."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from cli_runner import invoke_as_entry_point
from kubernetes.client import ApiException

from gpuenv.matrix.errors import GpuenvError
from gpuenv.run.kube import KubeError, client
from gpuenv.run.kube.layer import build_context
from gpuenv.run.workdir import MAX_FILES, collect

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters:
- name: lab
  cluster: {server: "https://127.0.0.1:6443", insecure-skip-tls-verify: true}
users:
- name: me
  user: {token: abc}
contexts:
- name: lab
  context: {cluster: lab, user: me, namespace: ml}
- name: other
  context: {cluster: lab, user: me}
current-context: lab
"""


@pytest.fixture
def kubeconfig(tmp_path):
    path = tmp_path / "config"
    path.write_text(KUBECONFIG)
    return str(path)


def test_no_cluster_configured(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(KubeError, match=r"^no Kubernetes cluster configured") as e:
        client.connect(None, None, kubeconfig=str(tmp_path / "missing"))
    assert e.value.exit_code == 125


def test_a_context_that_does_not_exist(kubeconfig):
    with pytest.raises(KubeError, match=r"context 'prod' does not exist.*the contexts are: lab, "):
        client.connect("prod", None, kubeconfig=kubeconfig)


def test_the_namespace_comes_from_the_flag_then_the_context(kubeconfig):
    assert client.connect(None, None, kubeconfig=kubeconfig).where.namespace == "ml"
    assert client.connect("other", None, kubeconfig=kubeconfig).where.namespace == "default"
    api = client.connect("lab", "team-a", kubeconfig=kubeconfig)
    assert (api.where.namespace, api.where.context) == ("team-a", "lab")
    assert api.where.server == "https://127.0.0.1:6443"


WHERE = client.Where("lab", "https://127.0.0.1:6443", "ml")


def status(code: int, message: str) -> ApiException:
    body = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                       "message": message, "code": code})  # fmt: skip
    exc = ApiException(status=code, reason="x")
    exc.body = body  # as a response sets it (the `body=` keyword is kubernetes 37+ only)
    return exc


def test_api_refusals_are_one_line():
    e401 = client.api_error(ApiException(status=401, reason="Unauthorized"), WHERE, "creating")
    assert "refused the credentials of context lab" in e401.message
    e403 = client.api_error(status(403, 'jobs.batch is forbidden: User "me" cannot create '
                                   'resource "jobs" in API group "batch" in the namespace "ml"'),
                            WHERE, "creating the Job")  # fmt: skip
    assert e403.message.startswith("forbidden (403) while creating the Job on context lab")
    assert 'cannot create resource "jobs"' in e403.message
    ns = client.api_error(status(404, 'namespaces "ml" not found'), WHERE, "creating the Job")
    assert ns.message.startswith("namespace ml does not exist on context lab")
    for err in (e401, e403, ns):
        assert err.exit_code == 125 and "\n" not in err.message


def test_an_unreachable_api_server():
    import urllib3

    exc = urllib3.exceptions.MaxRetryError(None, "/apis/batch/v1", "Connection refused")
    err = client.api_error(exc, WHERE, "creating the Job")
    assert err.message.startswith("cannot reach the Kubernetes API of context lab")


def test_kube_api_translates_the_clients_exceptions(kubeconfig):
    api = client.connect(None, None, kubeconfig=kubeconfig)

    def refuse(*a, **kw):
        raise status(404, 'namespaces "ml" not found')

    api.batch.create_namespaced_job = refuse
    with pytest.raises(KubeError, match=r"^namespace ml does not exist"):
        api.create_job("ml", {})


# ------------------------------------------------------------------- the code layer


def _names(ctx) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(ctx.tar)) as tar:
        return tar.getnames()


def test_code_layer_is_deterministic_and_leaves_out_caches(tmp_path):
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("x = 1\n")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("ref\n")
    (tmp_path / "pkg" / "__pycache__").mkdir()
    (tmp_path / "pkg" / "__pycache__" / "m.pyc").write_bytes(b"\0")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "big.bin").write_bytes(b"\0" * 10)
    (tmp_path / ".dockerignore").write_text("# data lives on a PVC\ndata\n")
    a = build_context(tmp_path, "reg/tf:cell", base_digest="sha256:1")
    assert collect(tmp_path) == [".dockerignore", "pkg", "pkg/m.py", "train.py"]
    assert _names(a) == ["Dockerfile", "workspace", "workspace/.dockerignore", "workspace/pkg",
                         "workspace/pkg/m.py", "workspace/train.py"]  # fmt: skip
    (tmp_path / "train.py").touch()  # a new mtime, same content
    b = build_context(tmp_path, "reg/tf:cell", base_digest="sha256:1")
    assert a.tar == b.tar and a.digest == b.digest
    assert build_context(tmp_path, "reg/tf:cell", base_digest="sha256:2").digest != a.digest
    with tarfile.open(fileobj=io.BytesIO(a.tar)) as tar:
        dockerfile = tar.extractfile("Dockerfile").read().decode()
    assert dockerfile.splitlines() == ["FROM reg/tf:cell", "LABEL io.gpuenv.code-base=sha256:1",
                                       "COPY --chown=1000:1000 workspace /workspace",
                                       "WORKDIR /workspace"]  # fmt: skip


def test_code_layer_limits(tmp_path, monkeypatch):
    import gpuenv.run.workdir as workdir

    (tmp_path / "a.bin").write_bytes(b"\0" * 100)
    monkeypatch.setattr(workdir, "MAX_BYTES", 50)
    with pytest.raises(GpuenvError, match=r"more than 0 MiB.*--pvc") as raised:
        build_context(tmp_path, "x")
    assert raised.value.exit_code == 125
    monkeypatch.setattr(workdir, "MAX_FILES", 0)
    with pytest.raises(GpuenvError, match=r"files, more than gpuenv sends.*--pvc"):
        build_context(tmp_path, "x")
    assert MAX_FILES == 20_000


def test_code_layer_leaves_secrets_out(tmp_path):
    """The review's M5: a project directory's credentials never reach a pushed layer."""
    (tmp_path / "train.py").write_text("print(1)\n")
    for name in (".env", ".env.local", ".netrc", "id_ed25519", ".pypirc"):
        (tmp_path / name).write_text("secret\n")
    for sub in (".aws/credentials", ".docker/config.json", ".ssh/id_rsa", "keys/id_rsa"):
        (tmp_path / sub).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / sub).write_text("secret\n")
    assert _names(build_context(tmp_path, "x")) == [
        "Dockerfile",
        "workspace",
        "workspace/keys",
        "workspace/train.py",
    ]


def test_a_dockerignore_exception_takes_a_path_back_into_the_layer(tmp_path):
    """As Docker reads it (issue 44): `!` re-includes; matrix/treepolicy.py's own tests
    hold the rest."""
    for rel in ("data/big.bin", "data/keep/labels.txt"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    (tmp_path / ".dockerignore").write_text("data\n!data/keep\n")
    assert collect(tmp_path) == [".dockerignore", "data", "data/keep", "data/keep/labels.txt"]


# ------------------------------------------------------------------- the verb


def gpuenv(args, cwd: Path, **env):
    """`gpuenv ARGS` run from ``cwd`` as the entry point runs it, in this process (a fresh
    interpreter importing the kubernetes client cost 1-2 s a call): (exit code, stderr)."""
    full = {"KUBECONFIG": str(cwd / "none"), "GPUENV_REGISTRY": None, **env}
    with contextlib.chdir(cwd):
        result = invoke_as_entry_point(args, env=full)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    return SimpleNamespace(returncode=result.exit_code, stderr=result.stderr)


@pytest.mark.parametrize("flags, line", [
    (["-v", "/data:/data"], "kube run: No such option: -v (see gpuenv kube run -h)"),
    (["-p", "8888:8888"], "kube run: No such option: -p (see gpuenv kube run -h)"),
    (["--gpus", "all"], "--gpus 'all': a pod asks for a number of GPUs, --gpus N (the device "
                        "plugin picks which; 'all' and device= mean nothing on a cluster)"),
])  # fmt: skip
def test_what_a_cluster_cannot_do_is_one_error(tmp_path, flags, line):
    """kube run's parser has its own options: a local one is Click's error there, by the
    old spelling (run --kube) too."""
    for argv in (["kube", "run", *flags, "python", "-V"], ["run", "--kube", *flags, "python"]):
        proc = gpuenv(argv, tmp_path, GPUENV_REGISTRY="localhost:5001")
        assert (proc.returncode, proc.stderr) == (125, f"error: {line}\n")


def test_detach_and_dry_run_are_one_or_the_other(tmp_path):
    proc = gpuenv(["kube", "run", "--detach", "--dry-run", "python", "-V"], tmp_path)
    assert (proc.returncode, proc.stderr) == (125, "error: --detach and --dry-run: give one\n")


def test_kube_options_mean_nothing_to_a_local_run(tmp_path):
    proc = gpuenv(["run", "--pvc", "data:/data", "--timeout", "1h", "python", "-V"], tmp_path)
    assert proc.returncode == 125
    assert proc.stderr == (
        "error: no such option: --pvc (put the command after --, or fix the option)\n"
    )


def test_no_registry_and_no_cluster(tmp_path):
    proc = gpuenv(["kube", "run", "python", "-V"], tmp_path)
    assert (proc.returncode, proc.stderr) == (125, "error: kube run needs a registry the cluster "
        "can pull from: --registry HOST[:PORT][/NAMESPACE] or $GPUENV_REGISTRY\n")  # fmt: skip
    proc = gpuenv(["run", "--kube", "python", "-V"], tmp_path, GPUENV_REGISTRY="localhost:5001",
                  KUBERNETES_SERVICE_HOST="")  # fmt: skip
    assert proc.returncode == 125
    assert proc.stderr.startswith("error: no Kubernetes cluster configured")


def test_attach_to_a_context_that_does_not_exist(tmp_path):
    (tmp_path / "none").write_text(KUBECONFIG)
    for argv in (["kube", "attach", "--context", "prod", "gpuenv-x-1"],
                 ["run", "--kube", "--context", "prod", "--attach", "gpuenv-x-1"]):  # fmt: skip
        proc = gpuenv(argv, tmp_path)
        assert proc.returncode == 125
        assert proc.stderr.startswith("error: Kubernetes context 'prod' does not exist")


def test_help_does_not_import_the_kubernetes_client():
    code = (
        "import sys, gpuenv.cli as c; sys.argv=['gpuenv','kube','run','--help'];\n"
        "try:\n    c.main()\nexcept SystemExit:\n    pass\n"
        "assert 'kubernetes' not in sys.modules and 'gpuenv.run.kube' not in sys.modules"
    )
    repo = Path(__file__).resolve().parents[2]
    run = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert run.returncode == 0, run.stderr
