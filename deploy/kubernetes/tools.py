"""The offline checking tools of the Kubernetes chart, pinned, installed into the stack's
directory (``.stack/tools``) from the registries this project reaches:

* ``helm`` and ``kubeconform`` and Prometheus' ``promtool``: ``go install`` of pinned
  module versions (the Go module proxy);
* the Kubernetes JSON schemas: the PyPI package ``kubernetes-validate`` (a dev
  dependency) ships them with ``$ref``s into a shared ``_definitions.json``; kubeconform
  wants one self-contained file per kind, so each kind's schema is written with the
  definitions it reaches inlined;
* the CRDs the chart uses (KEDA's ScaledObject, the Prometheus Operator's ServiceMonitor
  and PrometheusRule): from their Go modules' source archives on the module proxy
  (pinned by version and SHA-256), their OpenAPI schemas turned into strict JSON schemas.

No cluster is needed or contacted. ``python deploy/kubernetes/tools.py`` installs
everything and prints where; the test suite calls :func:`ensure`.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import urllib.request
import zipfile
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
STATE = Path(os.environ.get("WALCAST_STACK_DIR", REPO / ".stack")).resolve()
TOOLS = STATE / "tools"
BIN = TOOLS / "bin"
SCHEMAS = TOOLS / "schemas"

# The Kubernetes version manifests are validated against (kubernetes-validate's schemas).
KUBE_VERSION = "1.35.0"

GO_TOOLS = {
    "helm": ("helm.sh/helm/v3/cmd/helm", "v3.21.4"),
    "kubeconform": ("github.com/yannh/kubeconform/cmd/kubeconform", "v0.7.0"),
    "promtool": ("github.com/prometheus/prometheus/cmd/promtool", "v0.316.0"),
}

GOPROXY = "https://proxy.golang.org"
# module, version, SHA-256 of the proxy's zip, CRD files inside it
CRD_SOURCES = [
    (
        "github.com/kedacore/keda/v2",
        "v2.21.0",
        "74b59fe16144250748b716d6dc8789dee52d26164daab732145bed60456013a4",
        ["config/crd/bases/keda.sh_scaledobjects.yaml"],
    ),
    (
        "github.com/prometheus-operator/prometheus-operator",
        "v0.85.0",
        "0bdb88ed823d0f2e86cf909638439b6ad1da744a228172c7411d9987527dc5d1",
        [
            "example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml",
            "example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml",
        ],
    ),
]


class ToolError(RuntimeError):
    """A tool could not be installed; the message says which and why."""


def say(msg: str) -> None:
    print(f"[tools] {msg}", file=sys.stderr, flush=True)


def binary(name: str) -> Path:
    return BIN / name


def _stamp(name: str) -> Path:
    return BIN / f".{name}.version"


def install_go_tool(name: str) -> Path:
    """``go install`` the pinned version, once (a stamp file records it)."""
    module, version = GO_TOOLS[name]
    path = binary(name)
    if path.exists() and _stamp(name).exists() and _stamp(name).read_text() == version:
        return path
    go = shutil.which("go")
    if go is None:
        raise ToolError(f"{name}: the Go toolchain (`go`) is not on PATH; install Go 1.22+")
    BIN.mkdir(parents=True, exist_ok=True)
    say(f"building {name} {version} (go install {module}; a few minutes the first time)")
    env = {**os.environ, "GOBIN": str(BIN), "GOFLAGS": "-buildvcs=false"}
    result = subprocess.run(
        [go, "install", f"{module}@{version}"], env=env, capture_output=True, text=True
    )
    if result.returncode != 0:
        raise ToolError(f"{name}: go install {module}@{version} failed:\n{result.stderr[-3000:]}")
    _stamp(name).write_text(version)
    return path


# -- the Kubernetes schemas ----------------------------------------------------------------


def _kv_dir() -> Path:
    import kubernetes_validate

    base = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    path = base / f"v{KUBE_VERSION}-local-strict"
    if not path.is_dir():
        raise ToolError(f"kubernetes-validate has no schemas for {KUBE_VERSION} ({base})")
    return path


def _refs(node: Any, found: set[str]) -> None:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and "#/$defs/" in ref:
            found.add(ref.split("#/$defs/", 1)[1])
        for v in node.values():
            _refs(v, found)
    elif isinstance(node, list):
        for v in node:
            _refs(v, found)


def _local_refs(node: Any) -> Any:
    """Every ``/api/_definitions.json#/$defs/X`` made ``#/$defs/X``."""
    if isinstance(node, dict):
        out = {k: _local_refs(v) for k, v in node.items()}
        ref = out.get("$ref")
        if isinstance(ref, str) and "#/$defs/" in ref:
            out["$ref"] = "#/$defs/" + ref.split("#/$defs/", 1)[1]
        return out
    if isinstance(node, list):
        return [_local_refs(v) for v in node]
    return node


def kubernetes_schemas() -> Path:
    """One self-contained strict schema per kind (``<kind>[-<group>]-<version>.json``, the
    names kubeconform asks for), from kubernetes-validate's files."""
    out = SCHEMAS / f"v{KUBE_VERSION}"
    marker = out / ".complete"
    if marker.exists():
        return out
    src = _kv_dir()
    defs = json.loads((src / "_definitions.json").read_text())["$defs"]
    out.mkdir(parents=True, exist_ok=True)
    count = 0
    for path in sorted(src.glob("*.json")):
        if path.name in ("_definitions.json", "all.json"):
            continue
        schema = json.loads(path.read_text())
        kind = schema.get("properties", {}).get("kind", {})
        if not isinstance(kind, dict) or "enum" not in kind:
            continue  # not a top-level object: kubeconform never asks for it
        needed: set[str] = set()
        _refs(schema, needed)
        todo = list(needed)
        while todo:
            name = todo.pop()
            more: set[str] = set()
            _refs(defs[name], more)
            for m in more - needed:
                needed.add(m)
                todo.append(m)
        schema = _local_refs(schema)
        schema["$defs"] = {n: _local_refs(defs[n]) for n in sorted(needed)}
        (out / path.name).write_text(json.dumps(schema))
        count += 1
    say(f"{count} Kubernetes {KUBE_VERSION} schemas in {out}")
    marker.write_text("ok")
    return out


# -- CRDs ----------------------------------------------------------------------------------


def _strict(node: Any) -> Any:
    """An OpenAPI v3 schema of a CRD as strict JSON schema: objects with declared
    properties refuse others, unless the CRD keeps unknown fields."""
    if isinstance(node, dict):
        out = {k: _strict(v) for k, v in node.items() if not k.startswith("x-kubernetes-")}
        if node.get("x-kubernetes-int-or-string"):
            out.pop("type", None)
            out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
        if (
            "properties" in node
            and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        if node.get("nullable"):
            t = out.get("type")
            if isinstance(t, str):
                out["type"] = [t, "null"]
        out.pop("nullable", None)
        return out
    if isinstance(node, list):
        return [_strict(v) for v in node]
    return node


def crd_schemas() -> Path:
    """``<group>/<kind>_<version>.json`` for every CRD in :data:`CRD_SOURCES`."""
    out = SCHEMAS / "crds"
    marker = out / ".complete"
    if marker.exists():
        return out
    for module, version, digest, files in CRD_SOURCES:
        url = f"{GOPROXY}/{module}/@v/{version}.zip"
        say(f"fetching {url}")
        with urllib.request.urlopen(url, timeout=120) as r:  # noqa: S310 - fixed https URL
            data = r.read()
        got = hashlib.sha256(data).hexdigest()
        if got != digest:
            raise ToolError(f"{url}: SHA-256 {got}, expected {digest}")
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            for name in files:
                crd = yaml.safe_load(z.read(f"{module}@{version}/{name}"))
                group = crd["spec"]["group"]
                kind = crd["spec"]["names"]["kind"].lower()
                for v in crd["spec"]["versions"]:
                    schema = _strict(v["schema"]["openAPIV3Schema"])
                    props = schema.setdefault("properties", {})
                    props["apiVersion"] = {"type": "string", "enum": [f"{group}/{v['name']}"]}
                    props["kind"] = {"type": "string", "enum": [crd["spec"]["names"]["kind"]]}
                    props["metadata"] = {"type": "object"}
                    target = out / group / f"{kind}_{v['name']}.json"
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_text(json.dumps(schema))
    marker.write_text("ok")
    return out


def kubeconform_args() -> list[str]:
    """kubeconform's command line, strict, with the local schemas only (no download)."""
    k8s, crds = kubernetes_schemas(), crd_schemas()
    return [
        str(install_go_tool("kubeconform")),
        "-strict",
        "-summary",
        "-output", "json",
        "-kubernetes-version", KUBE_VERSION,
        "-schema-location", f"{k8s}/{{{{ .ResourceKind }}}}{{{{ .KindSuffix }}}}.json",
        "-schema-location",
        f"{crds}/{{{{ .Group }}}}/{{{{ .ResourceKind }}}}_{{{{ .ResourceAPIVersion }}}}.json",
    ]  # fmt: skip


def ensure() -> dict[str, Path]:
    """Everything the chart's checks need; returns the binaries."""
    tools = {name: install_go_tool(name) for name in GO_TOOLS}
    kubernetes_schemas()
    crd_schemas()
    return tools


if __name__ == "__main__":
    try:
        for name, path in ensure().items():
            print(f"{name}: {path}")
    except ToolError as exc:
        print(f"[tools] FAILED: {exc}", file=sys.stderr)
        sys.exit(1)
