"""deploy/: the Kubernetes manifests are valid Kubernetes objects and agree with each other and with `replay`.

No cluster and no kubeconform: every YAML document under deploy/ is checked field by field against the
Kubernetes API's own models (the `kubernetes` package's model classes: `openapi_types`, `attribute_map`,
required fields), so a typo'd or misplaced field, a wrong JSON type or a missing required field is an error
that names the file and the field's path. kustomization.yaml is checked by its own rules (resources,
generators, replicas, images and replacements point at things that exist) and rendered here for the
subset of kustomize it uses; when `kubectl` is on PATH, `kubectl kustomize` builds it as well and its output
goes through the same checks. Cross-checks: every container running `replay` parses with the real
`replay` parser (after Kubernetes' `$(VAR)` expansion), the workers' `--master HOST:PORT` is the master
Service's name and port and that Service reaches the master's `--master-bind` port, `--remote-workers`
equals the worker replicas, every ConfigMap key and volume used is defined, the spec is a valid generator
spec, the trace the master reads is written by its init container, and the run directory is on the PVC.
"""
from __future__ import annotations

import argparse
import base64
import contextlib
import copy
import inspect
import io
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tests.conftest import wait_s

kubernetes_client = pytest.importorskip(
    "kubernetes.client", reason="the `kubernetes` package (test extra) holds the API models the manifests are checked against")

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
KDIR = DEPLOY / "kubernetes"

# apiVersion, kind -> model class of the Kubernetes API
KINDS = {
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("v1", "Secret"): "V1Secret",
    ("v1", "Service"): "V1Service",
    ("v1", "Pod"): "V1Pod",
    ("v1", "PersistentVolumeClaim"): "V1PersistentVolumeClaim",
    ("v1", "Namespace"): "V1Namespace",
    ("v1", "ServiceAccount"): "V1ServiceAccount",
    ("batch/v1", "Job"): "V1Job",
    ("batch/v1", "CronJob"): "V1CronJob",
    ("apps/v1", "Deployment"): "V1Deployment",
    ("apps/v1", "StatefulSet"): "V1StatefulSet",
}
# Quantities (`cpu: 1`, `memory: 2Gi`) are int-or-string in the API; the models type them as str.
QUANTITY_FIELDS = {("V1ResourceRequirements", "limits"), ("V1ResourceRequirements", "requests"),
                   ("V1VolumeResourceRequirements", "limits"), ("V1VolumeResourceRequirements", "requests"),
                   ("V1EmptyDirVolumeSource", "size_limit")}
POD_TEMPLATE_KINDS = {"Job", "Deployment", "StatefulSet"}
KUSTOMIZATION_KEYS = {"apiVersion", "kind", "resources", "images", "replicas", "configMapGenerator",
                      "secretGenerator", "generatorOptions", "replacements", "labels", "commonLabels",
                      "commonAnnotations", "namespace", "namePrefix", "nameSuffix", "patches", "components"}
# applied on their own, after the master Job has finished (see the file's own comment)
STANDALONE = {"collect-pod.yaml"}


# --- strict validation against the API models ----------------------------------------------------

def _required(cls, attr: str) -> bool:
    fields = getattr(cls, "model_fields", None)
    if fields is not None:                      # kubernetes >= 35: pydantic models
        return attr in fields and fields[attr].is_required()
    prop = getattr(cls, attr, None)             # older generated models: the setter refuses None
    fset = getattr(prop, "fset", None)
    try:
        return fset is not None and "must not be `None`" in inspect.getsource(fset)
    except (OSError, TypeError):
        return False


def _type_name(v) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer",
            float: "number", type(None): "null"}.get(type(v), type(v).__name__)


def _walk(value, typ: str, path: str, errors: list[str]) -> None:
    def bad(expected: str) -> None:
        errors.append(f"{path}: expected {expected}, got {_type_name(value)} ({value!r:.40})")

    m = re.fullmatch(r"(?:List\[|list\[)(.+)\]", typ)
    if m:
        if not isinstance(value, list):
            return bad("array")
        for i, item in enumerate(value):
            _walk(item, m.group(1), f"{path}[{i}]", errors)
        return
    m = re.fullmatch(r"(?:Dict\[str, |dict\(str, )(.+)[\])]", typ)
    if m:
        if not isinstance(value, dict):
            return bad("object")
        for k, item in value.items():
            sub = f"{path}.{k}" if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(k)) else f"{path}[{str(k)!r}]"
            if not isinstance(k, str):
                errors.append(f"{sub}: key must be a string")
            _walk(item, m.group(1), sub, errors)
        return
    if typ == "quantity":
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            bad("a quantity (string or number)")
        return
    if typ == "object":
        return
    if typ == "str":
        return None if isinstance(value, str) else bad("string")
    if typ == "int":
        return None if isinstance(value, int) and not isinstance(value, bool) else bad("integer")
    if typ == "float":
        return None if isinstance(value, (int, float)) and not isinstance(value, bool) else bad("number")
    if typ == "bool":
        return None if isinstance(value, bool) else bad("boolean")
    if typ == "bytes":
        if not isinstance(value, str):
            return bad("base64 string")
        try:
            base64.b64decode(value, validate=True)
        except ValueError:
            errors.append(f"{path}: not valid base64")
        return
    if typ == "datetime":
        return None if isinstance(value, str) else bad("RFC 3339 date-time string")
    cls = getattr(kubernetes_client, typ, None)
    if cls is None:
        errors.append(f"{path}: no model {typ} in the kubernetes package (cannot check)")
        return
    if not isinstance(value, dict):
        return bad(f"object ({typ})")
    attr_of = {json: attr for attr, json in cls.attribute_map.items()}
    for key, item in value.items():
        sub = f"{path}.{key}" if path else str(key)
        attr = attr_of.get(key)
        if attr is None:
            errors.append(f"{sub}: unknown field")
            continue
        if item is None:
            continue  # null is "unset" in Kubernetes' YAML; a required one is reported below
        t = cls.openapi_types[attr]
        if (typ, attr) in QUANTITY_FIELDS:
            t = "Dict[str, quantity]" if t.lower().startswith("dict") else "quantity"
        _walk(item, t, sub, errors)
    for attr, json in cls.attribute_map.items():
        if _required(cls, attr) and value.get(json) is None:
            errors.append(f"{f'{path}.' if path else ''}{json}: required field missing")


def validate_document(doc) -> list[str]:
    """Errors of one Kubernetes object, each as 'field.path: what' (empty: valid)."""
    if not isinstance(doc, dict):
        return [f": expected an object, got {_type_name(doc)}"]
    key = (doc.get("apiVersion"), doc.get("kind"))
    model = KINDS.get(key)
    if model is None:
        return [f"apiVersion/kind: unknown or unsupported {key[0]!r}/{key[1]!r}"]
    errors: list[str] = []
    _walk(doc, model, "", errors)
    if not (doc.get("metadata") or {}).get("name"):
        errors.append("metadata.name: required field missing")
    return errors


def _rel(p: Path) -> str:
    try:
        return str(p.relative_to(REPO))
    except ValueError:
        return str(p)


def load_documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def errors_in_file(path: Path) -> list[str]:
    out = []
    docs = load_documents(path)
    for i, doc in enumerate(docs):
        where = _rel(path) + (f" (document {i + 1})" if len(docs) > 1 else "")
        out += [f"{where}: {e}" for e in validate_document(doc)]
    return out


def _kustomization_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.name in ("kustomization.yaml", "kustomization.yml"))


def _generator_files(kfile: Path) -> set[Path]:
    k = yaml.safe_load(kfile.read_text())
    out = set()
    for gen in (k.get("configMapGenerator") or []) + (k.get("secretGenerator") or []):
        for f in gen.get("files") or []:
            out.add((kfile.parent / f.split("=", 1)[-1]).resolve())
    return out


def manifest_files() -> list[Path]:
    """Every YAML file under deploy/ that is a Kubernetes manifest (not a kustomization, not a
    generator's input file such as spec.yaml)."""
    skip = {p.resolve() for p in _kustomization_files(DEPLOY)}
    for kf in _kustomization_files(DEPLOY):
        skip |= _generator_files(kf)
    return sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml") and p.resolve() not in skip)


# --- kustomization: rules and a renderer for the subset used ------------------------------------

def resolve_field(doc, field_path: str, create: bool = False):
    """(parent, key) of a kustomize fieldPath such as `spec.template.spec.containers.[name=x].args`."""
    node, parts = doc, field_path.split(".")
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        m = re.fullmatch(r"\[([^=\]]+)=([^\]]*)\]", part)
        if m:
            if not isinstance(node, list):
                raise KeyError(f"{field_path}: {part} selects in a non-list")
            match = [x for x in node if isinstance(x, dict) and str(x.get(m.group(1))) == m.group(2)]
            if len(match) != 1:
                raise KeyError(f"{field_path}: {part} matches {len(match)} elements")
            if last:
                return node, node.index(match[0])
            node = match[0]
        elif part.isdigit() and isinstance(node, list):
            if int(part) >= len(node):
                raise KeyError(f"{field_path}: index {part} out of range")
            if last:
                return node, int(part)
            node = node[int(part)]
        else:
            if not isinstance(node, dict) or (part not in node and not (create and last)):
                raise KeyError(f"{field_path}: no field {part!r}")
            if last:
                return node, part
            node = node[part]
    raise KeyError(field_path)


def _find(docs: list[dict], kind: str | None, name: str | None) -> list[dict]:
    return [d for d in docs if (kind is None or d.get("kind") == kind)
            and (name is None or d.get("metadata", {}).get("name") == name)]


def _pod_specs(doc: dict) -> list[dict]:
    if doc.get("kind") == "Pod":
        return [doc.get("spec") or {}]
    if doc.get("kind") in POD_TEMPLATE_KINDS:
        return [((doc.get("spec") or {}).get("template") or {}).get("spec") or {}]
    return []


def _containers(pod: dict, init: bool = True) -> list[dict]:
    return (pod.get("initContainers") or [] if init else []) + (pod.get("containers") or [])


def kustomization_errors(kfile: Path) -> list[str]:
    where = _rel(kfile)
    errs: list[str] = []
    k = yaml.safe_load(kfile.read_text())
    if not isinstance(k, dict):
        return [f"{where}: not a mapping"]
    for key in k:
        if key not in KUSTOMIZATION_KEYS:
            errs.append(f"{where}: {key}: unknown field")
    if k.get("apiVersion") != "kustomize.config.k8s.io/v1beta1" or k.get("kind") != "Kustomization":
        errs.append(f"{where}: apiVersion/kind must be kustomize.config.k8s.io/v1beta1 Kustomization")
    docs = []
    for i, r in enumerate(k.get("resources") or []):
        p = kfile.parent / r
        if not (p.is_file() or (p.is_dir() and _kustomization_files(p))):
            errs.append(f"{where}: resources[{i}]: {r} does not exist")
        elif p.is_file():
            docs += load_documents(p)
    for i, gen in enumerate(k.get("configMapGenerator") or []):
        at = f"{where}: configMapGenerator[{i}]"
        for key in gen:
            if key not in {"name", "literals", "files", "envs", "behavior", "options", "namespace"}:
                errs.append(f"{at}.{key}: unknown field")
        if not gen.get("name"):
            errs.append(f"{at}.name: required field missing")
        seen = set()
        for j, lit in enumerate(gen.get("literals") or []):
            key = str(lit).split("=", 1)[0]
            if "=" not in str(lit) or not re.fullmatch(r"[-._a-zA-Z0-9]+", key):
                errs.append(f"{at}.literals[{j}]: expected KEY=VALUE with a valid ConfigMap key, got {lit!r}")
            seen.add(key)
        for j, f in enumerate(gen.get("files") or []):
            key, _, src = f.rpartition("=")
            key = key or Path(src).name
            if not (kfile.parent / src).is_file():
                errs.append(f"{at}.files[{j}]: {src} does not exist")
            if key in seen:
                errs.append(f"{at}.files[{j}]: key {key} defined twice")
            seen.add(key)
    for i, rep in enumerate(k.get("replicas") or []):
        at = f"{where}: replicas[{i}]"
        if set(rep) - {"name", "count"}:
            errs.append(f"{at}: unknown field(s) {sorted(set(rep) - {'name', 'count'})}")
        if not [d for d in docs if d.get("kind") in ("Deployment", "StatefulSet")
                and d["metadata"].get("name") == rep.get("name")]:
            errs.append(f"{at}.name: no Deployment/StatefulSet {rep.get('name')!r} in the resources")
        if not isinstance(rep.get("count"), int) or isinstance(rep.get("count"), bool) or rep["count"] < 0:
            errs.append(f"{at}.count: expected an integer >= 0, got {rep.get('count')!r}")
    images = {c.get("image", "").split(":")[0] for d in docs for pod in _pod_specs(d) for c in _containers(pod)}
    for i, img in enumerate(k.get("images") or []):
        if set(img) - {"name", "newName", "newTag", "digest"}:
            errs.append(f"{where}: images[{i}]: unknown field(s) {sorted(set(img) - {'name', 'newName', 'newTag', 'digest'})}")
        if img.get("name") not in images:
            errs.append(f"{where}: images[{i}].name: no container uses image {img.get('name')!r}")
    for i, rep in enumerate(k.get("replacements") or []):
        at = f"{where}: replacements[{i}]"
        src = rep.get("source") or {}
        found = _find(docs, src.get("kind"), src.get("name"))
        if len(found) != 1:
            errs.append(f"{at}.source: {len(found)} resources match {src.get('kind')}/{src.get('name')}")
        else:
            try:
                resolve_field(found[0], src.get("fieldPath", "metadata.name"))
            except KeyError as e:
                errs.append(f"{at}.source.fieldPath: {e}")
        for j, tgt in enumerate(rep.get("targets") or []):
            sel = tgt.get("select") or {}
            hits = _find(docs, sel.get("kind"), sel.get("name"))
            if not hits:
                errs.append(f"{at}.targets[{j}].select: no resource {sel.get('kind')}/{sel.get('name')}")
            for d in hits:
                for fp in tgt.get("fieldPaths") or []:
                    try:
                        resolve_field(d, fp)
                    except KeyError as e:
                        errs.append(f"{at}.targets[{j}].fieldPaths: {e}")
    return errs


def render(kfile: Path) -> list[dict]:
    """kustomize's output for what kustomization.yaml uses (generators named without the hash suffix,
    which only renames them and every reference alike)."""
    k = yaml.safe_load(kfile.read_text())
    docs = []
    for gen in k.get("configMapGenerator") or []:
        data = dict(str(lit).split("=", 1) for lit in gen.get("literals") or [])
        for f in gen.get("files") or []:
            key, _, src = f.rpartition("=")
            data[key or Path(src).name] = (kfile.parent / src).read_text()
        docs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": gen["name"]}, "data": data})
    for r in k.get("resources") or []:
        docs += copy.deepcopy(load_documents(kfile.parent / r))
    for rep in k.get("replicas") or []:
        for d in _find(docs, None, rep["name"]):
            if d.get("kind") in ("Deployment", "StatefulSet"):
                d["spec"]["replicas"] = rep["count"]
    for img in k.get("images") or []:
        for d in docs:
            for pod in _pod_specs(d):
                for c in _containers(pod):
                    name, _, tag = c.get("image", "").partition(":")
                    if name == img["name"]:
                        c["image"] = f"{img.get('newName', name)}:{img.get('newTag', tag or 'latest')}"
    for rep in k.get("replacements") or []:
        src = rep["source"]
        parent, key = resolve_field(_find(docs, src.get("kind"), src.get("name"))[0], src.get("fieldPath", "metadata.name"))
        value = parent[key]
        for tgt in rep.get("targets") or []:
            sel = tgt.get("select") or {}
            for d in _find(docs, sel.get("kind"), sel.get("name")):
                for fp in tgt.get("fieldPaths") or []:
                    p, kk = resolve_field(d, fp, create=True)
                    p[kk] = str(value) if isinstance(p.get(kk) if isinstance(p, dict) else p[kk], str) else value
    return docs


# --- cross-checks: the objects agree with each other and with `replay` --------------------------

def _configmap_data(docs: list[dict], name: str) -> dict | None:
    found = _find(docs, "ConfigMap", name)
    return None if not found else {**(found[0].get("data") or {}), **(found[0].get("binaryData") or {})}


def _env_of(c: dict, docs: list[dict], at: str, errs: list[str]) -> dict[str, str]:
    env = {}
    for e in c.get("env") or []:
        ref = (e.get("valueFrom") or {}).get("configMapKeyRef")
        if "value" in e:
            env[e["name"]] = str(e["value"])
        elif ref:
            data = _configmap_data(docs, ref.get("name"))
            if data is None or ref.get("key") not in data:
                if not ref.get("optional"):
                    errs.append(f"{at}: env {e['name']}: ConfigMap {ref.get('name')!r} has no key {ref.get('key')!r}")
            else:
                env[e["name"]] = str(data[ref["key"]])
        elif (e.get("valueFrom") or {}).get("secretKeyRef") or (e.get("valueFrom") or {}).get("fieldRef"):
            env[e["name"]] = f"<{e['name']}>"
    return env


def expand(arg: str, env: dict[str, str], at: str, errs: list[str]) -> str:
    """Kubernetes' $(VAR) expansion of command/args ($$ escapes); an undefined one would stay literal."""
    def sub(m: re.Match) -> str:
        if m.group(0).startswith("$$"):
            return m.group(0)[1:]
        if m.group(1) not in env:
            errs.append(f"{at}: $({m.group(1)}) is not defined in the container's env")
            return m.group(0)
        return env[m.group(1)]
    return re.sub(r"\$\$\([A-Za-z_][A-Za-z0-9_]*\)|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", sub, arg)


def parse_replay(argv: list[str]):
    """The real `replay` parser on argv: (namespace, None) or (None, argparse's message)."""
    from llm_replay.replay.cli import build_parser
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            ns = build_parser().parse_args(argv)
    except SystemExit:
        return None, " ".join(err.getvalue().split()) or "argparse exited"
    if getattr(ns, "func", None) is None:
        return None, f"`replay {' '.join(argv)}` is no subcommand"
    # argparse also takes unique prefixes (--remote-w): a manifest spells every option in full
    parser, flags = build_parser(), set()
    for a in argv:
        sub = next((x.choices for x in parser._actions if isinstance(x, argparse._SubParsersAction)), {})
        if a in sub:
            parser = sub[a]
            flags = {o for x in parser._actions for o in x.option_strings}
        elif a.startswith("-") and a.split("=", 1)[0] not in flags:
            return None, f"{a}: not an option of `replay ...{parser.prog.removeprefix('replay')}` as spelled"
    return ns, None


def _mount_of(path: str, c: dict) -> dict | None:
    mounts = sorted(c.get("volumeMounts") or [], key=lambda m: -len(m.get("mountPath", "")))
    return next((m for m in mounts if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")), None)


def _labels_match(selector: dict, labels: dict) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def cross_check(docs: list[dict], extra: list[dict] = ()) -> list[str]:
    """Errors where the objects disagree with each other or with `replay`. `extra`: standalone objects
    (applied on their own) checked against `docs`."""
    errs: list[str] = []
    runs, workers = [], []   # (doc, container, namespace)
    pvcs = {d["metadata"]["name"] for d in docs if d.get("kind") == "PersistentVolumeClaim"}
    for d in list(docs) + list(extra):
        name = f"{d.get('kind')}/{d['metadata'].get('name')}"
        if d.get("kind") == "Deployment":
            sel = ((d["spec"].get("selector") or {}).get("matchLabels")) or {}
            if not _labels_match(sel, (d["spec"]["template"].get("metadata") or {}).get("labels") or {}):
                errs.append(f"{name}: spec.selector.matchLabels does not match the pod template's labels")
        for pod in _pod_specs(d):
            vols = {v["name"]: v for v in pod.get("volumes") or []}
            for v in vols.values():
                if "configMap" in v:
                    data = _configmap_data(docs, v["configMap"].get("name"))
                    if data is None:
                        errs.append(f"{name}: volume {v['name']}: no ConfigMap {v['configMap'].get('name')!r}")
                    for item in v["configMap"].get("items") or []:
                        if data is not None and item["key"] not in data:
                            errs.append(f"{name}: volume {v['name']}: ConfigMap has no key {item['key']!r}")
                if "persistentVolumeClaim" in v and v["persistentVolumeClaim"].get("claimName") not in pvcs:
                    errs.append(f"{name}: volume {v['name']}: no PersistentVolumeClaim "
                                f"{v['persistentVolumeClaim'].get('claimName')!r}")
            for c in _containers(pod):
                at = f"{name}: container {c.get('name')}"
                for m in c.get("volumeMounts") or []:
                    if m.get("name") not in vols:
                        errs.append(f"{at}: volumeMount {m.get('name')!r}: no such volume in the pod")
                req = (c.get("resources") or {}).get("requests") or {}
                if "cpu" not in req or "memory" not in req:
                    errs.append(f"{at}: resources.requests needs cpu and memory")
                if (c.get("command") or [None])[0] != "replay":
                    continue
                env = _env_of(c, docs, at, errs)
                argv = [expand(str(a), env, at, errs) for a in c.get("args") or []]
                ns, why = parse_replay(argv)
                if ns is None:
                    errs.append(f"{at}: `replay {' '.join(argv)}` does not parse: {why}")
                    continue
                # a path under a configMap mount must be one of its keys
                for a in argv:
                    m = _mount_of(a, c) if a.startswith("/") else None
                    v = vols.get(m["name"]) if m else None
                    if v and "configMap" in v and a != m["mountPath"]:
                        data = _configmap_data(docs, v["configMap"].get("name")) or {}
                        if a[len(m["mountPath"]):].lstrip("/") not in data:
                            errs.append(f"{at}: {a}: ConfigMap {v['configMap'].get('name')!r} has no such key")
                if ns.command == "run":
                    runs.append((d, pod, c, ns, vols))
                elif ns.command == "worker":
                    workers.append((d, c, ns))
    for d, pod, c, ns, vols in runs:
        at = f"{d['kind']}/{d['metadata']['name']}: container {c['name']}"
        # --target URL, or (repeatable) MODEL=URL: each URL as `replay run` accepts it
        for t in [ns.target] if isinstance(ns.target, str) else ns.target:
            url = t if re.match(r"https?://", t) else t.partition("=")[2]
            if not re.match(r"https?://[^/\s]+", url):
                errs.append(f"{at}: --target {t!r} is not an http(s) URL")
        host, _, port = ns.master_bind.rpartition(":")
        if not port.isdigit():
            errs.append(f"{at}: --master-bind {ns.master_bind!r} is not HOST:PORT")
            continue
        if ns.remote_workers and host not in ("0.0.0.0", "::", ""):
            errs.append(f"{at}: --master-bind {ns.master_bind}: bind all interfaces so the Service reaches it")
        ports = {p.get("name"): p["containerPort"] for p in c.get("ports") or []}
        if int(port) not in ports.values():
            errs.append(f"{at}: --master-bind port {port} is not a containerPort of the container")
        out = _mount_of(ns.out or "", c)
        if not out or "persistentVolumeClaim" not in vols.get(out["name"], {}):
            errs.append(f"{at}: -o {ns.out}: the run directory is not on a PersistentVolumeClaim mount")
        # the trace: written by an init container onto a volume the master mounts at the same path
        made = False
        for ic in pod.get("initContainers") or []:
            iargv = [expand(str(a), _env_of(ic, docs, at, []), at, []) for a in ic.get("args") or []]
            ins, _ = parse_replay(iargv) if (ic.get("command") or [None])[0] == "replay" else (None, None)
            if ins is not None and ins.command == "trace" and str(getattr(ins, "output", "")) == ns.trace:
                mi, mc = _mount_of(ns.trace, ic), _mount_of(ns.trace, c)
                made = bool(mi and mc and mi["name"] == mc["name"] and mi["mountPath"] == mc["mountPath"])
        tm = _mount_of(ns.trace, c)
        if not made and not (tm and "configMap" in vols.get(tm["name"], {})):
            errs.append(f"{at}: --trace {ns.trace}: neither written by an init container on a shared "
                        "volume nor a ConfigMap key")
        # the workers that join this master: through a Service that selects this pod
        labels = (d["spec"]["template"].get("metadata") or {}).get("labels") or {}
        joined = 0
        for wd, wc, wns in workers:
            wat = f"{wd['kind']}/{wd['metadata']['name']}: container {wc['name']}"
            whost, _, wport = wns.master.rpartition(":")
            svc = _find(docs, "Service", whost.split(".")[0])
            if not svc:
                errs.append(f"{wat}: --master {wns.master}: no Service named {whost.split('.')[0]!r}")
                continue
            spec = svc[0]["spec"]
            sport = next((p for p in spec.get("ports") or [] if str(p.get("port")) == wport), None)
            if sport is None:
                errs.append(f"{wat}: --master {wns.master}: Service {whost} has no port {wport}")
                continue
            if not _labels_match(spec.get("selector") or {}, labels):
                errs.append(f"{wat}: Service {whost} does not select the master pod (labels {labels})")
                continue
            target = sport.get("targetPort", sport["port"])
            if (ports.get(target) if isinstance(target, str) else target) != int(port):
                errs.append(f"{wat}: Service {whost} port {wport} -> targetPort {target!r}, "
                            f"but the master binds {port}")
                continue
            if wd.get("kind") == "Deployment":
                joined += wd["spec"].get("replicas", 1)
            else:
                errs.append(f"{wat}: workers should be a Deployment (got {wd['kind']})")
        if joined != ns.remote_workers:
            errs.append(f"{at}: --remote-workers {ns.remote_workers} but {joined} worker pod(s) join it")
        cpu = str(((c.get("resources") or {}).get("requests") or {}).get("cpu", "0"))
        cores = float(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu)
        if cores < ns.workers + 1:
            errs.append(f"{at}: requests {cpu} CPU for the master and {ns.workers} local worker process(es): "
                        f"one core each")
    for wd, wc, wns in workers:
        cpu = str(((wc.get("resources") or {}).get("requests") or {}).get("cpu", "0"))
        if (float(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu)) < 1:
            errs.append(f"{wd['kind']}/{wd['metadata']['name']}: a worker process needs one core (requests {cpu})")
    if not runs:
        errs.append("no container runs `replay run`")
    return errs


def _spec_errors(docs: list[dict]) -> list[str]:
    """Every generator spec in a ConfigMap parses as `replay trace generate --spec` reads it."""
    from llm_replay.traces.spec import parse_spec
    errs = []
    for d in docs:
        for key, text in (d.get("data") or {}).items() if d.get("kind") == "ConfigMap" else ():
            if key.endswith((".yaml", ".yml")):
                try:
                    parse_spec(yaml.safe_load(text), file=key)
                except Exception as e:  # noqa: BLE001 - the message is the point
                    errs.append(f"ConfigMap/{d['metadata']['name']}: {e}")  # e names the key
    return errs


def _master_job(docs):
    return _find(docs, "Job", "llm-replay-master")[0]


def _standalone() -> list[dict]:
    return [d for f in sorted(STANDALONE) for d in load_documents(KDIR / f)]


# --- the tests ----------------------------------------------------------------------------------

def test_deploy_has_manifests_and_a_kustomization():
    names = {p.name for p in manifest_files()}
    assert {"master-job.yaml", "worker-deployment.yaml", "master-service.yaml", "runs-pvc.yaml"} <= names
    assert (KDIR / "kustomization.yaml").is_file() and (KDIR / "Dockerfile").is_file()


@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: _rel(p))
def test_manifest_is_a_valid_kubernetes_object(path):
    assert errors_in_file(path) == []


def test_every_manifest_is_a_resource_or_standalone():
    k = yaml.safe_load((KDIR / "kustomization.yaml").read_text())
    listed = {(KDIR / r).resolve() for r in k["resources"]} | {(KDIR / f).resolve() for f in STANDALONE}
    assert [_rel(p) for p in manifest_files() if p.resolve() not in listed] == []


def test_kustomization_rules():
    assert [e for kf in _kustomization_files(DEPLOY) for e in kustomization_errors(kf)] == []


def test_rendered_objects_are_valid_and_agree():
    docs = render(KDIR / "kustomization.yaml")
    assert [e for d in docs for e in validate_document(d)] == []
    assert cross_check(docs, _standalone()) == []
    assert _spec_errors(docs) == []
    # the knobs took effect: replicas -> the Deployment and the master's --remote-workers
    k = yaml.safe_load((KDIR / "kustomization.yaml").read_text())
    n = k["replicas"][0]["count"]
    assert _find(docs, "Deployment", "llm-replay-worker")[0]["spec"]["replicas"] == n
    env = {e["name"]: e.get("value") for e in _master_job(docs)["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["REMOTE_WORKERS"] == str(n)
    # the raw files agree on their own too (kubectl apply -f without kustomize)
    raw = {d["metadata"]["name"]: d for f in k["resources"] for d in load_documents(KDIR / f)}
    raw_env = {e["name"]: e.get("value") for e in raw["llm-replay-master"]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert raw_env["REMOTE_WORKERS"] == str(raw["llm-replay-worker"]["spec"]["replicas"])


def test_other_replica_counts_stay_in_sync(tmp_path):
    """Changing only `replicas:` in kustomization.yaml changes both sides."""
    d = tmp_path / "k"
    shutil.copytree(KDIR, d)
    k = yaml.safe_load((d / "kustomization.yaml").read_text())
    k["replicas"][0]["count"] = 7
    (d / "kustomization.yaml").write_text(yaml.safe_dump(k))
    docs = render(d / "kustomization.yaml")
    assert cross_check(docs) == []
    assert _find(docs, "Deployment", "llm-replay-worker")[0]["spec"]["replicas"] == 7


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not on PATH (the kustomize build is checked where it is)")
def test_kubectl_kustomize_builds_and_its_output_checks():
    p = subprocess.run(["kubectl", "kustomize", str(KDIR)], capture_output=True, text=True, timeout=wait_s(60))
    assert p.returncode == 0, p.stderr
    docs = [d for d in yaml.safe_load_all(p.stdout) if d]
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == ["ConfigMap", "ConfigMap", "Deployment", "Job", "PersistentVolumeClaim", "Service"]
    assert [e for d in docs for e in validate_document(d)] == []
    assert cross_check(docs, _standalone()) == []
    assert _spec_errors(docs) == []
    # generated ConfigMaps carry a hash suffix and every reference was rewritten to it
    names = {d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap"}
    assert all(re.fullmatch(r"llm-replay-(config|spec)-[a-z0-9]+", n) for n in names), names
    img = yaml.safe_load((KDIR / "kustomization.yaml").read_text())["images"][0]
    assert {c["image"] for d in docs for pod in _pod_specs(d) for c in _containers(pod)} == \
        {f"{img['newName']}:{img['newTag']}"}


def test_the_commands_are_what_the_design_says():
    docs = render(KDIR / "kustomization.yaml")
    job = _master_job(docs)["spec"]["template"]["spec"]
    env = {"TARGET_URL": "http://t:8000", "RUN_ID": "r", "REMOTE_WORKERS": "2"}
    ns, why = parse_replay([expand(a, env, "", []) for a in job["containers"][0]["args"]])
    assert why is None and ns.command == "run" and ns.master_bind == "0.0.0.0:5557" and ns.out == "/runs/r"
    ns, why = parse_replay(job["initContainers"][0]["args"])
    assert why is None and ns.command == "trace" and str(ns.spec) == "/config/spec.yaml"
    w = _find(docs, "Deployment", "llm-replay-worker")[0]["spec"]["template"]["spec"]["containers"][0]
    ns, why = parse_replay(w["args"])
    assert why is None and ns.command == "worker" and ns.master == "locust-master:5557"


def test_dockerfile_copies_every_package_folder():
    import tomllib
    package_dirs = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values())
    text = (KDIR / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim\b", text, re.M)
    copied = set()
    for m in re.finditer(r"^COPY\s+(.+?)\s+\S+\s*$", text, re.M):
        for src in m.group(1).split():
            assert (REPO / src).exists(), f"COPY {src}: not in the repository"
            copied.add(src.rstrip("/"))
    assert package_dirs <= copied, package_dirs - copied
    assert {"pyproject.toml", "README.md"} <= copied   # readme = "README.md" in pyproject
    assert "torch" not in re.sub(r"#.*", "", text)     # the load generator does not need it


# --- the checks can fail --------------------------------------------------------------------------

def _job_doc() -> dict:
    return load_documents(KDIR / "master-job.yaml")[0]


def test_validator_rejects_a_typo_a_wrong_type_and_a_missing_field():
    doc = _job_doc()
    c = doc["spec"]["template"]["spec"]["containers"][0]
    c["comand"] = c.pop("command")
    c["ports"][0]["containerPort"] = "5557"
    del doc["spec"]["template"]["spec"]["initContainers"][0]["name"]
    doc["spec"]["backoffLimit"] = True
    doc["spec"]["template"]["spec"]["volumes"][0]["configMap"]["nam"] = "x"
    errs = validate_document(doc)
    assert "spec.template.spec.containers[0].comand: unknown field" in errs
    assert any(e.startswith("spec.template.spec.containers[0].ports[0].containerPort: expected integer, got string")
               for e in errs), errs
    assert "spec.template.spec.initContainers[0].name: required field missing" in errs
    assert any(e.startswith("spec.backoffLimit: expected integer, got boolean") for e in errs), errs
    assert "spec.template.spec.volumes[0].configMap.nam: unknown field" in errs
    assert len(errs) == 5, errs


def test_validator_names_the_file(tmp_path, monkeypatch):
    bad = tmp_path / "deploy" / "kubernetes" / "master-job.yaml"
    bad.parent.mkdir(parents=True)
    bad.write_text((KDIR / "master-job.yaml").read_text().replace("restartPolicy: Never", "restartPolicy: [Never]")
                   .replace("kind: Job", "kind: Jbo"))
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    assert errors_in_file(bad) == ["deploy/kubernetes/master-job.yaml: apiVersion/kind: unknown or unsupported "
                                   "'batch/v1'/'Jbo'"]
    bad.write_text((KDIR / "master-job.yaml").read_text().replace("restartPolicy: Never", "restartPolicy: [Never]"))
    [e] = errors_in_file(bad)
    assert e.startswith("deploy/kubernetes/master-job.yaml: spec.template.spec.restartPolicy: expected string, got array")
    # env values are strings in the API: an unquoted number is an error there too
    bad.write_text((KDIR / "master-job.yaml").read_text().replace('value: "2"', "value: 2"))
    [e] = errors_in_file(bad)
    assert "spec.template.spec.containers[0].env[2].value: expected string, got integer" in e


def _broken(mutate) -> list[str]:
    docs = render(KDIR / "kustomization.yaml")
    mutate(docs)
    return cross_check(docs, _standalone())


def _spec(docs, name):
    return _find(docs, None, name)[0]["spec"]


def test_cross_checks_fail_where_the_objects_disagree():
    def worker_args(args):
        def f(docs):
            _spec(docs, "llm-replay-worker")["template"]["spec"]["containers"][0]["args"] = args
        return f
    assert any("no Service named 'master'" in e for e in _broken(worker_args(["worker", "--master", "master:5557"])))
    assert any("has no port 5558" in e for e in _broken(worker_args(["worker", "--master", "locust-master:5558"])))
    assert any("does not parse" in e and "--master" in e for e in _broken(worker_args(["worker", "--mastr", "x:1"])))

    def replicas(docs):
        _spec(docs, "llm-replay-worker")["replicas"] = 3
    assert any("--remote-workers 2 but 3 worker pod(s) join it" in e for e in _broken(replicas))

    def flag(docs):
        _spec(docs, "llm-replay-master")["template"]["spec"]["containers"][0]["args"][7] = "--remote-wrkers"
    assert any("does not parse" in e for e in _broken(flag))

    def key(docs):
        env = _spec(docs, "llm-replay-master")["template"]["spec"]["containers"][0]["env"]
        env[0]["valueFrom"]["configMapKeyRef"]["key"] = "url"
    errs = _broken(key)
    assert any("ConfigMap 'llm-replay-config' has no key 'url'" in e for e in errs), errs
    assert any("$(TARGET_URL) is not defined" in e for e in errs), errs

    def spec_path(docs):
        _spec(docs, "llm-replay-master")["template"]["spec"]["initContainers"][0]["args"][3] = "/config/trace.yaml"
    errs = _broken(spec_path)
    assert any("/config/trace.yaml: ConfigMap 'llm-replay-spec' has no such key" in e for e in errs), errs

    def selector(docs):
        _find(docs, "Service", "locust-master")[0]["spec"]["selector"]["app.kubernetes.io/component"] = "worker"
    assert any("does not select the master pod" in e for e in _broken(selector))

    def run_dir(docs):
        args = _spec(docs, "llm-replay-master")["template"]["spec"]["containers"][0]["args"]
        args[args.index("-o") + 1] = "/work/run"
    assert any("not on a PersistentVolumeClaim mount" in e for e in _broken(run_dir))

    def cores(docs):
        _spec(docs, "llm-replay-worker")["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "500m"
    assert any("needs one core" in e for e in _broken(cores))


def test_kustomization_rules_fail(tmp_path):
    d = tmp_path / "k"
    shutil.copytree(KDIR, d)
    k = yaml.safe_load((d / "kustomization.yaml").read_text())
    k["resources"].append("missing.yaml")
    k["replicas"][0]["name"] = "llm-replay-workers"
    k["images"][0]["name"] = "llm-replai"
    k["configMapGenerator"][0]["literals"].append("not a literal")
    k["replacements"][0]["targets"][0]["fieldPaths"][0] += "x"
    k["commonLables"] = {}
    (d / "kustomization.yaml").write_text(yaml.safe_dump(k))
    errs = "\n".join(kustomization_errors(d / "kustomization.yaml"))
    for want in ("resources[4]: missing.yaml does not exist", "no Deployment/StatefulSet 'llm-replay-workers'",
                 "no container uses image 'llm-replai'", "expected KEY=VALUE", "no field 'valuex'",
                 "commonLables: unknown field"):
        assert want in errs, (want, errs)


def test_spec_errors_are_reported():
    docs = render(KDIR / "kustomization.yaml")
    _find(docs, "ConfigMap", "llm-replay-spec")[0]["data"]["spec.yaml"] = "duration: 10\nclients: [{name: a, rate: -1}]\n"
    assert len(_spec_errors(docs)) == 1
