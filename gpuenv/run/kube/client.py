"""The cluster, through the official `kubernetes` client (imported inside functions only).

`connect()` reads the kubeconfig (or the in-cluster service account) and gives a `KubeApi`:
the handful of calls `gpuenv kube run` makes, returning the client's own model objects
(V1Job, V1Pod, CoreV1Event). Every refusal leaves here as one KubeError line (exit 125):
no cluster configured, a context that does not exist, 401/403, a missing namespace, an
unreachable API server.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from gpuenv.run.kube import KubeError

INSTALL = "pip install 'gpuenv[kube]' (the official kubernetes client)"
IN_CLUSTER_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def _kubernetes() -> Any:
    try:
        import kubernetes
    except ImportError:
        raise KubeError(f"gpuenv kube needs the kubernetes client: {INSTALL}") from None
    return kubernetes


@dataclass
class Where:
    """Which cluster and namespace, for messages."""

    context: str
    server: str
    namespace: str


def api_message(exc: Any) -> str:
    """The API server's own message from an ApiException (its body is a v1 Status)."""
    body = getattr(exc, "body", None)
    if body:
        try:
            doc = json.loads(body)
            if isinstance(doc, dict) and doc.get("message"):
                return str(doc["message"])
        except ValueError:
            return str(body).strip().splitlines()[0][:300]
    return str(getattr(exc, "reason", "") or exc).strip()


def api_error(exc: Exception, where: Where, doing: str) -> KubeError:
    """An exception from the client, as one line saying what to do."""
    status = getattr(exc, "status", None)
    ctx = f"context {where.context} ({where.server})"
    if status is None:  # urllib3: refused, DNS, TLS
        text = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        return KubeError(f"cannot reach the Kubernetes API of {ctx}: {text}")
    message = api_message(exc)
    if status == 401:
        return KubeError(
            f"the cluster refused the credentials of {ctx} (401 Unauthorized) while "
            f"{doing}: log in again or refresh the token in your kubeconfig"
        )
    if status == 403:
        return KubeError(f"forbidden (403) while {doing} on {ctx}: {message}")
    if status == 404 and f'namespaces "{where.namespace}" not found' in message:
        return KubeError(
            f"namespace {where.namespace} does not exist on {ctx}: kubectl create namespace "
            f"{where.namespace}, or pass --namespace"
        )
    if status == 404:
        return KubeError(f"not found (404) while {doing} in namespace {where.namespace}: {message}")
    return KubeError(f"the cluster refused ({status}) while {doing} on {ctx}: {message}")


class KubeApi:
    """The calls gpuenv makes, over a configured kubernetes.client.ApiClient."""

    def __init__(self, api_client: Any, where: Where) -> None:
        k = _kubernetes()
        self.where = where
        self.batch = k.client.BatchV1Api(api_client)
        self.core = k.client.CoreV1Api(api_client)

    def _call(self, doing: str, fn: Any, *args: Any, **kw: Any) -> Any:
        try:
            return fn(*args, **kw)
        except Exception as exc:
            if getattr(exc, "status", None) is None and not _is_connection_error(exc):
                raise
            raise api_error(exc, self.where, doing) from None

    def create_job(self, namespace: str, body: dict[str, Any]) -> Any:
        return self._call("creating the Job", self.batch.create_namespaced_job, namespace, body)

    def read_job(self, namespace: str, name: str) -> Any:
        return self._call(f"reading Job {name}", self.batch.read_namespaced_job, name, namespace)

    def delete_job(self, namespace: str, name: str) -> None:
        """The Job and its pods (background propagation: the garbage collector removes them)."""
        self._call(
            f"deleting Job {name}", self.batch.delete_namespaced_job, name, namespace,
            propagation_policy="Background",
        )  # fmt: skip

    def list_pods(self, namespace: str, job: str) -> list[Any]:
        result = self._call(
            "listing the Job's pods", self.core.list_namespaced_pod, namespace,
            label_selector=f"job-name={job}",
        )  # fmt: skip
        return list(result.items or [])

    def list_events(self, namespace: str, name: str) -> list[Any]:
        """Events about one object; an account that may not list events gets none."""
        try:
            result = self.core.list_namespaced_event(
                namespace, field_selector=f"involvedObject.name={name}"
            )
        except Exception as exc:
            if getattr(exc, "status", None) in (401, 403):
                return []
            raise api_error(exc, self.where, "listing events") from None
        return list(result.items or [])

    def logs(self, namespace: str, pod: str, container: str, *, follow: bool) -> Iterator[bytes]:
        resp = self._call(
            f"reading the logs of {pod}", self.core.read_namespaced_pod_log, pod, namespace,
            container=container, follow=follow, _preload_content=False,
        )  # fmt: skip
        try:
            yield from resp.stream(65536)
        finally:
            resp.release_conn()


def _is_connection_error(exc: Exception) -> bool:
    mod = type(exc).__module__
    return mod.startswith("urllib3") or isinstance(exc, (ConnectionError, TimeoutError))


def connect(context: str | None, namespace: str | None, kubeconfig: str | None = None) -> KubeApi:
    """The cluster of --context (else the kubeconfig's current context, else the pod's own
    service account), and the namespace (--namespace, else the context's, else default)."""
    k = _kubernetes()
    from kubernetes.config.config_exception import ConfigException

    try:
        contexts, current = k.config.list_kube_config_contexts(config_file=kubeconfig)
    except (ConfigException, FileNotFoundError):
        contexts, current = None, None
    if not contexts:
        if context:
            raise KubeError(
                f"Kubernetes context {context!r} does not exist: there is no kubeconfig "
                "($KUBECONFIG or ~/.kube/config)"
            )
        try:
            k.config.load_incluster_config()
        except ConfigException:
            raise KubeError(
                "no Kubernetes cluster configured: no kubeconfig ($KUBECONFIG or "
                "~/.kube/config) and not inside a pod; set one up (kubectl config "
                "use-context) or pass --context"
            ) from None
        ns = namespace or _in_cluster_namespace()
        where = Where("in-cluster", k.client.Configuration.get_default_copy().host, ns)
        return KubeApi(k.client.ApiClient(), where)
    names = [str(c.get("name")) for c in contexts]
    if context is not None and context not in names:
        raise KubeError(
            f"Kubernetes context {context!r} does not exist in your kubeconfig; the contexts "
            f"are: {', '.join(names)}"
        )
    chosen = next((c for c in contexts if c.get("name") == context), None) if context else current
    if not chosen:
        raise KubeError("your kubeconfig has no current context; pass --context NAME")
    try:
        api_client = k.config.new_client_from_config(
            config_file=kubeconfig, context=chosen["name"], persist_config=False
        )
    except (ConfigException, OSError, ValueError) as exc:
        raise KubeError(
            f"Kubernetes context {chosen['name']!r} cannot be used: "
            f"{str(exc).strip().splitlines()[0][:300]}"
        ) from None
    ns = namespace or (chosen.get("context") or {}).get("namespace") or "default"
    return KubeApi(api_client, Where(chosen["name"], api_client.configuration.host, ns))


def _in_cluster_namespace() -> str:
    try:
        with open(IN_CLUSTER_NAMESPACE, encoding="utf-8") as fh:
            return fh.read().strip() or "default"
    except OSError:
        return "default"
