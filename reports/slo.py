"""SLO spec (docs/reports.md, SLO spec): per-request thresholds that define a good request, aggregate
objectives that must all hold, and overrides per slo_class or model.

Read from YAML, TOML, or `[tool.replay.slo]` in a pyproject.toml; every error names the field.
"""
from __future__ import annotations

import difflib
import operator
import re
from dataclasses import dataclass, field
from pathlib import Path

from .errors import SloSpecError
from .metrics import LATENCIES
from .stats import STATS

PER_REQUEST = {"ttft_ms": ("ttft_ms", 1.0), "ttfa_ms": ("ttfa_ms", 1.0), "tpot_ms": ("tpot_ms", 1.0),
               "e2e_ms": ("e2e_ms", 1.0), "e2e_s": ("e2e_ms", 1000.0)}
TASK_METRICS = ("task_s",)        # agentic tasks (reports/tasks.py): first schedule to last end
TASK_SCALARS = ("task_attainment", "task_goodput_per_s", "tasks_per_s")
# Server-side decomposition of each request from its joined server span (reports/servertime.py)
SPAN_METRICS = ("server_ttft_ms", "server_e2e_ms", "queue_ms", "prefill_ms", "decode_ms", "net_ms",
                "queue_share", "prefill_share", "net_share")
DIST_METRICS = tuple(LATENCIES) + tuple(m.replace("_ms", "_sched_ms") for m in LATENCIES) + TASK_METRICS + SPAN_METRICS
SCALARS = ("attainment", "error_rate", "goodput_rps", "token_goodput_per_s", "requests_per_s",
           "output_tokens_per_s") + TASK_SCALARS
OPS = {"<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt}
_OBJ = re.compile(r"^\s*([a-z0-9_]+)(?:\.(mean|p50|p90|p95|p99|p99\.9|max))?\s*(<=|<|>=|>)\s*"
                  r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*$")
TOP_KEYS = ("name", "per_request", "per_task", "objectives", "classes", "confidence")


@dataclass(frozen=True)
class Objective:
    text: str
    metric: str            # a distribution metric (ttft_ms, ...) or a scalar (attainment, ...)
    stat: str | None       # mean, p50, ..., max; None for scalars
    op: str
    limit: float

    def holds(self, measured: float) -> bool:
        return bool(OPS[self.op](measured, self.limit))


@dataclass
class ClassSpec:
    per_request: dict[str, float] = field(default_factory=dict)
    objectives: list[Objective] = field(default_factory=list)


@dataclass
class SloSpec:
    per_request: dict[str, float] = field(default_factory=dict)   # normalised: ttft_ms, tpot_ms, e2e_ms
    objectives: list[Objective] = field(default_factory=list)
    classes: dict[str, ClassSpec] = field(default_factory=dict)
    confidence: float = 0.95        # each verdict's (docs/verdicts.md)
    name: str | None = None
    source: str | None = None
    per_task: dict[str, float] = field(default_factory=dict)     # task_s: a good task's longest time

    @property
    def has_per_request(self) -> bool:
        return bool(self.per_request) or any(c.per_request for c in self.classes.values())

    def to_dict(self) -> dict:
        return {"name": self.name, "source": self.source, "per_request": self.per_request, "per_task": self.per_task,
                "objectives": [o.text for o in self.objectives],
                "classes": {k: {"per_request": c.per_request, "objectives": [o.text for o in c.objectives]}
                            for k, c in self.classes.items()},
                "confidence": self.confidence}


def parse_objective(text: object, where: str, src: object = None) -> Objective:
    if not isinstance(text, str):
        raise SloSpecError(f"an objective is a string like 'ttft_ms.p99 <= 800', got {text!r}",
                           file=src, field=where)
    m = _OBJ.match(text)
    if not m:
        n = len(re.findall(r"[<>]=?", text))
        # YAML continues a plain scalar onto a deeper-indented line: two list items become one string
        folded = (f"; it holds {n} objectives in one string: in YAML give each its own '- ' line, every "
                  "dash at the same indentation (a deeper-indented line continues the one above)") if n > 1 else ""
        raise SloSpecError(f"cannot parse {text!r}: expected '<metric>.<stat> <op> <number>' "
                           f"(e.g. 'ttft_ms.p99 <= 800') or '<scalar> <op> <number>' "
                           f"(e.g. 'attainment >= 0.95'){folded}", file=src, field=where)
    metric, stat, op, limit = m.group(1), m.group(2), m.group(3), float(m.group(4))
    if stat is None and metric not in SCALARS:
        hint = (f"; did you mean '{metric}.p99'?" if metric in DIST_METRICS else _did_you_mean(metric, SCALARS))
        raise SloSpecError(f"unknown scalar {metric!r} in {text!r}{hint} (scalars: {', '.join(SCALARS)})",
                           file=src, field=where)
    if stat is not None and metric not in DIST_METRICS:
        raise SloSpecError(f"unknown metric {metric!r} in {text!r}{_did_you_mean(metric, DIST_METRICS, '.' + stat)} "
                           f"(metrics: {', '.join(DIST_METRICS)})", file=src, field=where)
    assert stat is None or stat in STATS
    return Objective(text.strip(), metric, stat, op, limit)


def _did_you_mean(name: str, names, suffix: str = "") -> str:
    near = difflib.get_close_matches(name, names, 1)
    return f"; did you mean '{near[0]}{suffix}'?" if near else ""


def _per_request(raw: object, where: str, src: object) -> dict[str, float]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise SloSpecError("must be a mapping like {ttft_ms: 500, tpot_ms: 50}", file=src, field=where)
    out = {}
    for key, value in raw.items():
        if key not in PER_REQUEST:
            raise SloSpecError(f"unknown per-request threshold {key!r}{_did_you_mean(str(key), PER_REQUEST)} "
                               f"(allowed: {', '.join(PER_REQUEST)})",
                               file=src, field=f"{where}.{key}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise SloSpecError(f"must be a positive number, got {value!r}", file=src, field=f"{where}.{key}")
        name, scale = PER_REQUEST[key]
        out[name] = float(value) * scale
    return out


def _per_task(raw: object, src: object) -> dict[str, float]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise SloSpecError("must be a mapping like {task_s: 60}", file=src, field="per_task")
    for key, value in raw.items():
        if key != "task_s":
            raise SloSpecError(f"unknown per-task threshold {key!r} (allowed: task_s)", file=src, field=f"per_task.{key}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise SloSpecError(f"must be a positive number, got {value!r}", file=src, field=f"per_task.{key}")
    return {k: float(v) for k, v in raw.items()}


def _objectives(raw: object, where: str, src: object) -> list[Objective]:
    if raw is None:
        return []
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list):
        raise SloSpecError("must be a list of strings like 'ttft_ms.p99 <= 800'", file=src, field=where)
    return [parse_objective(t, f"{where}[{i}]", src) for i, t in enumerate(raw)]


def check_confidence(c: object, source: object = None) -> float:
    """A verdict's confidence: a number in [0.5, 1)."""
    if isinstance(c, bool) or not isinstance(c, (int, float)) or not 0.5 <= c < 1:
        raise SloSpecError(f"must be a number from 0.5 to below 1 (e.g. 0.95), got {c!r}", file=source,
                           field="confidence")
    return float(c)


def spec_from_dict(raw: object, source: object = None) -> SloSpec:
    if not isinstance(raw, dict):
        raise SloSpecError(f"an SLO spec is a mapping with keys {', '.join(TOP_KEYS)}", file=source)
    if "min_tail_samples" in raw:
        raise SloSpecError("min_tail_samples is gone: every percentile is judged at a confidence bound, "
                           "whatever n (set `confidence:`, default 0.95)", file=source, field="min_tail_samples")
    for key in raw:
        if key not in TOP_KEYS:
            raise SloSpecError(f"unknown key (allowed: {', '.join(TOP_KEYS)})", file=source, field=key)
    classes = {}
    craw = raw.get("classes") or {}
    if not isinstance(craw, dict):
        raise SloSpecError("must map a slo_class or model name to {per_request, objectives}",
                           file=source, field="classes")
    for name, c in craw.items():
        where = f"classes.{name}"
        if not isinstance(c, dict) or not set(c) <= {"per_request", "objectives"}:
            raise SloSpecError("must be a mapping with keys per_request and/or objectives",
                               file=source, field=where)
        classes[str(name)] = ClassSpec(_per_request(c.get("per_request"), f"{where}.per_request", source),
                                       _objectives(c.get("objectives"), f"{where}.objectives", source))
    spec = SloSpec(_per_request(raw.get("per_request"), "per_request", source),
                   _objectives(raw.get("objectives"), "objectives", source), classes,
                   check_confidence(raw.get("confidence", 0.95), source),
                   raw.get("name"), str(source) if source else None, _per_task(raw.get("per_task"), source))
    if not (spec.objectives or spec.has_per_request or spec.per_task or any(c.objectives for c in classes.values())):
        raise SloSpecError("the spec sets neither per_request thresholds nor objectives", file=source)
    return spec


MAX_SPEC_BYTES = 1 << 20


def _read(path: Path) -> object:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise SloSpecError(f"cannot read SLO spec: {e.strerror or e}", file=path) from None
    except UnicodeDecodeError as e:
        raise SloSpecError(f"not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start}): an SLO spec is "
                           "YAML or TOML", file=path) from None
    if len(text) > MAX_SPEC_BYTES:
        raise SloSpecError(f"{len(text):,} characters: an SLO spec is a few lines (at most {MAX_SPEC_BYTES:,})",
                           file=path)
    if path.suffix == ".toml":
        import tomllib
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise SloSpecError(f"invalid TOML: {e}", file=path) from None
        except RecursionError:
            raise SloSpecError("invalid TOML: nested too deeply", file=path) from None
        tool = data.get("tool", {}).get("replay", {})
        if "slo" in tool:
            return tool["slo"]
        if path.name == "pyproject.toml":
            raise SloSpecError("no [tool.replay.slo] table", file=path)
        return data
    import yaml
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise SloSpecError(f"invalid YAML: {e}", file=path) from None
    except RecursionError:   # PyYAML's composer recurses once per nesting level
        raise SloSpecError("invalid YAML: nested too deeply", file=path) from None


def load_slo(path_or_dict: str | Path | dict | SloSpec) -> SloSpec:
    """An SloSpec from a YAML/TOML file, a pyproject.toml ([tool.replay.slo]) or a dict."""
    if isinstance(path_or_dict, SloSpec):
        return path_or_dict
    if isinstance(path_or_dict, dict):
        return spec_from_dict(path_or_dict)
    path = Path(path_or_dict)
    if path.is_dir():
        path = path / "pyproject.toml"
    raw = _read(path)
    if path.name == "slo.json" and isinstance(raw, dict):   # an older `replay run --slo`'s own copy
        raw.pop("min_tail_samples", None)
    return spec_from_dict(raw, path)

