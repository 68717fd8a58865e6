"""pytest plugin (entry point `pytest11`): SLO-gated replay tests.

    def test_chat_slo(replay):
        result = replay("traces/chat.parquet", max_requests=200)
        result.assert_slo("slo.yaml")

    @pytest.mark.slo("ttft_ms.p99 <= 800", "attainment >= 0.95")
    def test_gated(replay):
        replay("chat", duration=30, rate=2)      # a preset name generates the trace

With an SLO known before the run (the `slo` marker, or `replay(trace, slo=...)`), each replay runs
until its gate is decided (`replay run --until-decided`: further passes of the trace, stopped at the
first decided look; `until_decided=False` or `--replay-fixed-length`: the trace once).

Options: `--replay-target [MODEL=]URL` (repeatable; else a session fixture starts engine-stub on a free port),
`--replay-runs-dir DIR`, `--replay-engine-arg ARG` (repeatable), `--replay-arg ARG` (passed to
every `replay run`). Each replay runs in a child process: this plugin never imports locust.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

_OBJECTIVE = re.compile(r"(<=|>=|<|>)")


@dataclass
class ReplayResult:
    """One finished replay: its run directory, summary and gate helpers."""

    run_dir: Path
    summary: dict
    returncode: int
    output: str = ""
    gates: list = field(default_factory=list)
    as_measured: bool = False            # --replay-as-measured
    confidence: float | None = None      # --replay-confidence

    @property
    def metrics(self) -> dict[str, float]:
        from llm_replay import reports
        return reports.headline(self.summary)

    def gate(self, slo: Any, as_measured: bool = False, confidence: float | None = None,
             judge_as_measured: bool = False, allow_client_bottleneck: bool = False):
        """Gate this run at `confidence` (--replay-confidence; default the spec's, else 0.95):
        pass, fail or undecided (exit 2) per objective, docs/verdicts.md; figures that a replay
        behind its schedule may have moved are judged at both ends of their bias bound. Point
        estimates with `as_measured` (--replay-as-measured; `judge_as_measured` and
        `allow_client_bottleneck` are its old names)."""
        from llm_replay import reports
        result = reports.evaluate_slo(self.run_dir, _load_slo(slo), confidence=confidence or self.confidence,
                                      as_measured=as_measured or judge_as_measured or allow_client_bottleneck
                                      or self.as_measured)
        self.gates.append(result)
        return result

    def assert_slo(self, slo: Any) -> None:
        __tracebackhide__ = True   # a failure shows the test's line and the gate table, not this method
        result = self.gate(slo)
        if result.exit_code != 0:
            raise AssertionError(_verdict(self.run_dir, result))


def _verdict(run_dir: Path, gate) -> str:
    """The gate table (with the first errors when requests failed) under the run directory."""
    verdict = "failed" if gate.exit_code == 1 else "not delivered" if gate.undelivered else \
        "undecided" if any(r.verdict == "undecided" for r in gate.rows) else "could not be evaluated"
    return f"SLO {verdict} for run {run_dir}:\n{gate.table()}"


def _load_slo(slo: Any):
    """A path, a spec dict, an SloSpec, or a list of objective strings."""
    from llm_replay import reports
    return reports.load_slo({"objectives": list(slo)} if isinstance(slo, (list, tuple)) else slo)


def slo_from_marker(mark: pytest.Mark):
    """`slo("slo.yaml")`, `slo("ttft_ms.p99 <= 800", ...)`, `slo(per_request=..., objectives=...)`."""
    objectives = [a for a in mark.args if isinstance(a, str) and _OBJECTIVE.search(a)]
    files = [a for a in mark.args if a not in objectives]
    if files and (objectives or mark.kwargs):
        raise pytest.UsageError("@pytest.mark.slo takes a file or objectives/keywords, not both")
    if files:
        return _load_slo(files[0])
    return _load_slo({**mark.kwargs, "objectives": list(mark.kwargs.get("objectives", [])) + objectives}
                     if objectives else dict(mark.kwargs))


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("replay", "llm-replay SLO tests")
    group.addoption("--replay-target", action="append", metavar="[MODEL=]URL",
                    help="OpenAI-compatible base URL to test (env REPLAY_TARGET, space-separated); MODEL=URL "
                         "(repeatable) sends that trace model's rows to its own deployment; default: local engine-stub")
    group.addoption("--replay-runs-dir", help="directory for run directories (default: pytest's tmp dir)")
    for flag, to in (("--replay-engine-arg", "the auto-started engine-stub"), ("--replay-arg", "every `replay run`")):
        group.addoption(flag, action="append", default=[], help=f"extra argument for {to} (repeatable)")
    group.addoption("--replay-require-target", action="store_true", help="fail when no target is given (env "
                    "REPLAY_REQUIRE_TARGET=1): in CI, a missing secret must not pass having tested nothing",
                    default=os.environ.get("REPLAY_REQUIRE_TARGET", "") not in ("", "0"))
    group.addoption("--replay-as-measured", "--replay-judge-as-measured", "--replay-allow-client-bottleneck",
                    dest="replay_as_measured", action="store_true", help="judge every figure at its measured value "
                    "(k6's semantics): no confidence bounds, no bias bound (docs/verdicts.md)")
    group.addoption("--replay-fixed-length", action="store_true", help="replay each trace once, not until the gate "
                    "is decided (docs/verdicts.md#run-until-decided)")
    group.addoption("--replay-confidence", type=float, metavar="C",
                    help="each gate verdict's confidence (default: the SLO spec's, else 0.95)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slo(*file_or_objectives, **spec): gate every replay run of the test on its SLO")


@pytest.fixture(scope="session")
def replay_targets(request: pytest.FixtureRequest, replay_target: str) -> list[str]:
    """Every `replay run --target` value: the default URL, then the MODEL=URL ones."""
    return ([replay_target] if replay_target else []) + [t for t in _given_targets(request.config) if not _url(t)]


def _given_targets(config: pytest.Config) -> list[str]:
    return config.getoption("--replay-target") or os.environ.get("REPLAY_TARGET", "").split()


def _url(target: str) -> bool:
    return re.match(r"https?://", target) is not None


@pytest.fixture(scope="session")
def replay_target(request: pytest.FixtureRequest):
    """The default base URL under test: the plain --replay-target URL; with none, a session-wide
    local engine-stub (unless every trace model has its own MODEL=URL target: then "")."""
    if given := _given_targets(request.config):   # the plain URL; only MODEL=URL ones: "" (no default deployment)
        yield next((t.rstrip("/") for t in given if _url(t)), "")
        return
    if request.config.getoption("--replay-require-target"):
        pytest.fail("no target: --replay-target and REPLAY_TARGET are empty, and --replay-require-target (or env "
                    "REPLAY_REQUIRE_TARGET=1) forbids a local engine-stub (forks get no secrets)", pytrace=False)
    try:
        import llm_replay.engine_stub.cli  # noqa: F401  (only to know it is installed; the engine runs as a child)
    except ImportError as e:
        pytest.skip(f"no --replay-target and engine-stub is not installed ({e}); "
                    "pip install 'llm-replay[engine]' or pass --replay-target URL")
    from llm_replay.replay.orchestrate import start_engine
    engine = start_engine(*request.config.getoption("--replay-engine-arg"))
    yield engine.url
    engine.stop()


@pytest.fixture
def replay(request: pytest.FixtureRequest, replay_targets: list[str], tmp_path: Path):
    """Call `replay(trace, **run_options)`: replays a trace file or a preset name and returns
    a ReplayResult. Options become `replay run` flags (`max_requests=50` -> `--max-requests 50`);
    for a preset, `duration`, `rate`, `seed` and `length_scale` shape the generated trace."""
    runs: list[ReplayResult] = []
    base = request.config.getoption("--replay-runs-dir")
    runs_dir = Path(base) / request.node.name if base else tmp_path / "runs"

    def run(trace: str | os.PathLike, **options: Any) -> ReplayResult:
        __tracebackhide__ = True
        from llm_replay import reports
        from llm_replay.replay.orchestrate import replay_run, run_args
        path = Path(trace)
        if not path.exists():
            from llm_replay.traces.presets import PRESETS
            if str(trace) not in PRESETS:   # a mistyped path: say the file is missing
                raise FileNotFoundError(f"replay({str(trace)!r}): no such trace file (from {Path.cwd()}), and "
                                        f"not a preset name either (presets: {', '.join(PRESETS)})")
            path = _preset_trace(str(trace), options, tmp_path)
        run_dir = runs_dir / f"run-{len(runs)}"
        extra = _until_args(request, options, runs_dir, len(runs))
        extra += run_args(options) + _key_args() + list(request.config.getoption("--replay-arg"))
        outcome = replay_run(path, replay_targets, run_dir, extra=extra)
        if not (run_dir / "records.parquet").exists():
            raise RuntimeError(f"replay run produced no records (exit {outcome.returncode}):\n{outcome.output[-3000:]}")
        result = ReplayResult(run_dir, reports.summarize_run(run_dir), outcome.returncode, outcome.output,
                              as_measured=request.config.getoption("replay_as_measured"),
                              confidence=request.config.getoption("replay_confidence"))
        request.node.user_properties += [(f"replay.{len(runs)}.{name}", v) for name, v in result.metrics.items()]
        runs.append(result)
        return result

    run.runs = runs  # the marker's gate reads them after the test body
    return run


def _until_args(request: pytest.FixtureRequest, options: dict, runs_dir: Path, k: int) -> list[str]:
    """`--slo FILE --until-decided` when the SLO is known before the run and the test did not opt out."""
    import json
    spec, until = options.pop("slo", None), options.pop("until_decided", True)
    mark = request.node.get_closest_marker("slo")
    spec = slo_from_marker(mark) if spec is None and mark is not None else spec
    if spec is None or not until or request.config.getoption("replay_fixed_length"):
        return []
    spec = _load_slo(spec)
    conf = request.config.getoption("replay_confidence")
    runs_dir.mkdir(parents=True, exist_ok=True)
    path = runs_dir / f"slo-{k}.yaml"   # JSON is YAML
    path.write_text(json.dumps({key: v for key, v in spec.to_dict().items() if key not in ("source", "name")}))
    return ["--slo", str(path), "--until-decided", *(["--confidence", str(conf)] if conf else [])]


def _key_args() -> list[str]:
    """The API key travels in REPLAY_API_KEY (the `replay run` child reads it by name: never on a
    command line); set but empty is a missing secret, said as such."""
    if "REPLAY_API_KEY" not in os.environ:
        return []
    if not os.environ["REPLAY_API_KEY"]:
        pytest.fail("REPLAY_API_KEY is set but empty: a missing secret (forks get none); unset it for a target without "
                    "a key (examples/github/slo-gate.yml: delete its REPLAY_API_KEY line)", pytrace=False)
    return ["--api-key-env", "REPLAY_API_KEY"]


def _preset_trace(name: str, options: dict, tmp_path: Path) -> Path:
    from llm_replay.traces.generate import generate
    from llm_replay.traces.presets import preset_spec
    spec = preset_spec(name, duration=options.pop("duration", 30), rate=options.pop("rate", None),
                       length_scale=options.pop("length_scale", None))
    path = tmp_path / f"{name}.parquet"
    generate(spec, seed=options.pop("seed", 0)).write(path)
    return path


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    result = yield
    mark = item.get_closest_marker("slo")
    runner = getattr(item, "funcargs", {}).get("replay")
    if mark is None or runner is None:
        return result
    slo = slo_from_marker(mark)
    # pytrace=False: the report is the message alone, not this hook's source above it
    if not runner.runs:
        pytest.fail("@pytest.mark.slo: the test made no replay run to gate", pytrace=False)
    gates = [(run, run.gate(slo)) for run in runner.runs]
    item.user_properties += [(f"slo.{run.run_dir.name}", "fail" if g.exit_code else "pass") for run, g in gates]
    if failures := [_verdict(run.run_dir, g) for run, g in gates if g.exit_code]:
        pytest.fail("\n".join(failures), pytrace=False)
    return result
