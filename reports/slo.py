"""SLO spec (docs/reports.md, SLO spec): per-request thresholds that define a good request, aggregate
objectives that must all hold, and overrides per slo_class or model.

Read from YAML, TOML, or `[tool.replay.slo]` in a pyproject.toml; every error names the field.
"""
from __future__ import annotations

import difflib
import operator
import re
import reprlib
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Annotated

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, InstanceOf, PlainSerializer,
                      ValidationError, model_validator)

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
TENANT_SCALARS = ("fairness", "attainment_fairness", "min_tenant_attainment")   # over tenants (Analysis.tenants)
SCALARS = ("attainment", "error_rate", "goodput_rps", "token_goodput_per_s", "requests_per_s",
           "output_tokens_per_s", "prefix_hit") + TASK_SCALARS + TENANT_SCALARS
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


def parse_objective(text: object, where: str | None = None, src: object = None) -> Objective:
    error = partial(SloSpecError, file=src, field=where)
    if not isinstance(text, str):
        raise error(f"an objective is a string like 'ttft_ms.p99 <= 800', got {text!r}")
    m = _OBJ.match(text)
    if not m:
        n = len(re.findall(r"[<>]=?", text))
        # YAML continues a plain scalar onto a deeper-indented line: two list items become one string
        folded = (f"; it holds {n} objectives in one string: in YAML give each its own '- ' line, every "
                  "dash at the same indentation (a deeper-indented line continues the one above)") if n > 1 else ""
        raise error(f"cannot parse {text!r}: expected '<metric>.<stat> <op> <number>' (e.g. 'ttft_ms.p99 <= 800') "
                    f"or '<scalar> <op> <number>' (e.g. 'attainment >= 0.95'){folded}")
    metric, stat, op, limit = m.group(1), m.group(2), m.group(3), float(m.group(4))
    if stat is None and metric not in SCALARS:
        hint = (f"; did you mean '{metric}.p99'?" if metric in DIST_METRICS else _did_you_mean(metric, SCALARS))
        raise error(f"unknown scalar {metric!r} in {text!r}{hint} (scalars: {', '.join(SCALARS)})")
    if stat is not None and metric not in DIST_METRICS:
        raise error(f"unknown metric {metric!r} in {text!r}{_did_you_mean(metric, DIST_METRICS, '.' + stat)} "
                    f"(metrics: {', '.join(DIST_METRICS)})")
    assert stat is None or stat in STATS
    return Objective(text.strip(), metric, stat, op, limit)


def _did_you_mean(name: str, names, suffix: str = "") -> str:
    near = difflib.get_close_matches(name, names, 1)
    return f"; did you mean '{near[0]}{suffix}'?" if near else ""


def check_confidence(c: object, source: object = None, field: str | None = "confidence") -> float:
    """A verdict's confidence: a number in [0.5, 1)."""
    if isinstance(c, bool) or not isinstance(c, (int, float)) or not 0.5 <= c < 1:
        raise SloSpecError(f"must be a number from 0.5 to below 1 (e.g. 0.95), got {c!r}", file=source, field=field)
    return float(c)


def _keys(allowed, what: str = "key"):
    """A before-validator: a mapping (None: empty) whose keys are all allowed; an error names the key."""
    def check(raw: object) -> dict:
        if not isinstance(raw, dict | None):
            raise SloSpecError(f"must be a mapping with keys {', '.join(allowed)}")
        for key in raw or {}:
            if key not in allowed:
                raise SloSpecError(f"unknown {what} {key!r}{_did_you_mean(str(key), allowed)} "
                                   f"(allowed: {', '.join(allowed)})", field=str(key))
        return raw or {}
    return BeforeValidator(check)


def _listed(raw: object) -> list:
    if not isinstance(raw, list | str | None):
        raise SloSpecError("must be a list of strings like 'ttft_ms.p99 <= 800'")
    return [] if raw is None else [raw] if isinstance(raw, str) else raw


# Thresholds are normalised to the record's own units (e2e_s -> e2e_ms)
_Positive = Annotated[float, Field(gt=0, strict=True)]
_PerRequest = Annotated[dict[str, _Positive], _keys(PER_REQUEST, "per-request threshold"),
                        AfterValidator(lambda d: {PER_REQUEST[k][0]: v * PER_REQUEST[k][1] for k, v in d.items()})]
_Objectives = Annotated[list[Annotated[InstanceOf[Objective], BeforeValidator(parse_objective),
                                       PlainSerializer(lambda o: o.text)]],
                        BeforeValidator(_listed)]


class ClassSpec(BaseModel):
    per_request: _PerRequest = {}
    objectives: _Objectives = []

    _known = model_validator(mode="before")(_keys(("per_request", "objectives")).func)


class SloSpec(BaseModel):
    """The dict form (`to_dict`, slo.json) is the contract: it loads back into the same spec."""
    model_config = ConfigDict(coerce_numbers_to_str=True)
    name: str | None = None
    source: str | None = None       # set by the loader, not a key of the spec
    per_request: _PerRequest = {}
    per_task: Annotated[dict[str, _Positive], _keys(("task_s",), "per-task threshold")] = {}
    objectives: _Objectives = []
    classes: Annotated[dict[str, ClassSpec], BeforeValidator(lambda v: {} if v is None else v)] = {}
    confidence: Annotated[float, BeforeValidator(lambda c: check_confidence(c, field=None))] = 0.95  # docs/verdicts.md

    @model_validator(mode="before")
    @classmethod
    def _known(cls, raw: object) -> object:
        if isinstance(raw, dict) and "min_tail_samples" in raw:
            raise SloSpecError("min_tail_samples is gone: every percentile is judged at a confidence bound, "
                               "whatever n (set `confidence:`, default 0.95)", field="min_tail_samples")
        return _keys(TOP_KEYS).func(raw)

    @model_validator(mode="after")
    def _sets_something(self) -> SloSpec:
        if not (self.objectives or self.has_per_request or self.per_task or
                any(c.objectives for c in self.classes.values())):
            raise SloSpecError("the spec sets neither per_request thresholds nor objectives")
        return self

    @property
    def has_per_request(self) -> bool:
        return bool(self.per_request) or any(c.per_request for c in self.classes.values())

    def to_dict(self) -> dict:
        return self.model_dump()


def spec_from_dict(raw: object, source: object = None) -> SloSpec:
    try:
        spec = SloSpec.model_validate(raw)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        cause = err.get("ctx", {}).get("error")    # our own SloSpecError: its rule, and the key it names
        msg = err["msg"].replace("Input should be", "must be").replace("valid dictionary", "mapping")
        rule = cause.rule if isinstance(cause, SloSpecError) else f"{msg}, got {reprlib.repr(err['input'])}"
        loc = [*err["loc"], *([cause.field] if isinstance(cause, SloSpecError) and cause.field else [])]
        field = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc if p != "[key]").lstrip(".")
        raise SloSpecError(rule, file=source, field=field or None) from None
    spec.source = str(source) if source else None
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
    import tomllib
    import yaml
    toml = path.suffix == ".toml"
    kind = "TOML" if toml else "YAML"
    try:
        data = tomllib.loads(text) if toml else yaml.safe_load(text)
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as e:
        raise SloSpecError(f"invalid {kind}: {e}", file=path) from None
    except RecursionError:   # PyYAML's composer recurses once per nesting level
        raise SloSpecError(f"invalid {kind}: nested too deeply", file=path) from None
    if not toml:
        return data
    tool = data.get("tool", {}).get("replay", {})
    if "slo" in tool:
        return tool["slo"]
    if path.name == "pyproject.toml":
        raise SloSpecError("no [tool.replay.slo] table", file=path)
    return data


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

