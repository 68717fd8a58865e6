"""Replay with Locust's own CLI and web UI:

    locust -f replay/locustfile.py --host http://127.0.0.1:8000 --trace T.parquet --run-dir runs/x
    locust -f replay/locustfile.py --headless -u 1 -r 1 --host URL --trace T.parquet
    locust -f replay/locustfile.py --master ...   /   locust -f replay/locustfile.py --worker

The user class is the same Dispatcher that `replay run` uses (one per process; start one
user per worker process), and the replay options are `replay run`'s, registered through
`events.init_command_line_parser`. Records and run.json go to --run-dir exactly as with
`replay run`; Locust's statistics and UI are the dashboard.
"""
from __future__ import annotations

import os
import sys
import time

import gevent.event  # noqa: E402
from locust import events  # noqa: E402
from locust.runners import LocalRunner, MasterRunner, WorkerRunner  # noqa: E402

from llm_replay.replay.dispatcher import Dispatcher  # noqa: E402,F401  (the user class Locust finds)

_state: dict = {}


@events.init_command_line_parser.add_listener
def _add_arguments(parser) -> None:
    from llm_replay.replay.run_cmd import add_run_arguments, add_target_argument
    parser.add_argument("--trace", help="replay: trace file (Parquet)", default="")
    parser.add_argument("--run-dir", help="replay: run directory (default runs/locust-<UTC time>)")
    add_target_argument(parser)   # MODEL=URL: per-model deployments; --host is the default target
    add_run_arguments(parser)
    # Locust serves its web UI, which starts load against the target, on every interface with
    # no login; here only on this host unless --web-host says otherwise
    parser.set_defaults(web_host="127.0.0.1")


@events.init.add_listener
def _on_init(environment, **kw) -> None:
    runner = environment.runner
    if isinstance(runner, WorkerRunner):
        from llm_replay.replay.worker import WorkerSide
        WorkerSide(environment)
        return
    opts = environment.parsed_options
    if opts is None or not opts.trace:
        return
    from llm_replay.replay.parent import prepare_run_dir
    from llm_replay.replay.preflight import build_config
    host = environment.host or opts.host
    opts.target = ([host] if host else []) + [t for t in opts.target if t != host]
    opts.out = opts.run_dir or f"runs/locust-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
    opts.workers, opts.remote_workers, opts.master_bind = 1, 0, ""
    try:
        config, notes = build_config(opts)
        if isinstance(runner, MasterRunner):
            config.workers = max(1, opts.expect_workers or 1)
        prepare_run_dir(config, notes)
    except Exception as e:  # noqa: BLE001 - bad input or a target that fails the check: one line
        if getattr(e, "exit_code", None) is None:
            raise
        print(f"error: {e}", file=sys.stderr, flush=True)
        os._exit(int(e.exit_code))   # before Locust has started anything: nothing to clean up
    _state["config"] = config


@events.test_start.add_listener
def _on_test_start(environment, **kw) -> None:
    config = _state.get("config")
    if config is None or "out" in _state or isinstance(environment.runner, WorkerRunner):
        return
    from llm_replay.replay.output import Output
    from llm_replay.replay.runner import start_local, start_master
    out = _state["out"] = Output(config)
    start = start_local if isinstance(environment.runner, LocalRunner) else start_master
    job = _state["job"] = start(environment, config, out)   # a Job, or a distributed run's Master
    gevent.spawn(_quit_when_done, environment, job.finished)


def _quit_when_done(environment, done) -> None:
    done.wait()
    _finish()
    if environment.parsed_options.headless:
        environment.runner.quit()
    else:
        environment.runner.stop()


@events.test_stop.add_listener
def _on_test_stop(environment, **kw) -> None:
    """Stopped from the UI or by --run-time: unsent rows -> not_sent, in flight -> cancelled."""
    if "job" in _state and not _state["job"].finished.is_set():
        _state["job"].stop()
        _state["job"].finished.wait(timeout=_state["config"].grace_s + 20)
        _finish()


@events.quitting.add_listener
def _on_quitting(environment, **kw) -> None:
    _finish()


def _finish() -> None:
    """Close the run once; a second caller (the stop, the quit and the job's end all call this, and
    closing yields to the loop) waits for the first, else Locust exits before records.parquet exists."""
    closed = _state.get("closed")
    if closed is not None:
        closed.wait()
        return
    out = _state.pop("out", None)
    if out is None:
        return
    closed = _state["closed"] = gevent.event.Event()
    try:
        from llm_replay.replay.output import update_run_json
        counts = out.close()
        status = "interrupted" if getattr(_state.get("job"), "stopping", False) else "completed"
        update_run_json(out.dir, status=status, status_counts=counts, ended_wall=time.time())
        print(f"replay: run directory {out.dir}", file=sys.stderr)
    finally:
        closed.set()
