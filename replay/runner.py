"""The runner process: Locust's Environment used as a library.

`python -m llm_replay.replay.runner RUN_DIR` (started by `replay run`) reads RUN_DIR/run.json, then
- one process (`--workers 1`): `create_local_runner`, the Dispatcher user runs a Job that
  reads the trace window itself and writes records straight into RUN_DIR;
- `--workers N`: `create_master_runner` + N local `replay.worker` processes (and any
  `--remote-workers` joining with `replay worker --master HOST:PORT`); a `Master` shards the
  trace, ships rows, T0 and records by custom messages and writes one records file.

T0 is a wall-clock epoch chosen here (now + lead) and mapped once to each process's
perf_counter. `gc.collect(); gc.freeze()` before T0. SIGINT/SIGTERM stop dispatching.
"""
from __future__ import annotations

from gevent import monkey  # first: locust would do it anyway; do it before anything imports ssl

monkey.patch_all()

import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import gevent.pool  # noqa: E402
from locust.env import Environment  # noqa: E402

from . import plan  # noqa: E402
from .dispatcher import Dispatcher, Job  # noqa: E402
from .master import Master  # noqa: E402
from .output import Output, update_run_json  # noqa: E402
from .preflight import http_call  # noqa: E402
from .process import (ProcessContext, cpu_seconds, die_with_parent, freeze_gc, perf_at,  # noqa: E402
                      preconnect, target_labels)
from .run_cmd import UNWRITABLE  # noqa: E402


def warmup(job: Job, n: int) -> None:
    """`n` short requests before T0 (not recorded): connections and server warm."""
    from .client import stream_post
    from .otlp import header
    group = gevent.pool.Group()
    for label in target_labels(job.c):   # each deployment, with a model it serves
        req = {"model": job.c.target_model(label), "max_tokens": 2, "stream": True}
        if job.c.api == "chat":     # the run's own API: a chat-only target has no /v1/completions
            path, req["messages"] = "/v1/chat/completions", [{"role": "user", "content": "Say hello."}]
        else:
            path, req["prompt"] = "/v1/completions", [1000, 1001, 1002, 1003]
        body, pool = json.dumps(req).encode(), job.pool_for(label)
        extra = header(job.c.run_id, "warmup")[0] if job.c.otlp else b""   # counted as the client's own span
        for _ in range(n):
            group.spawn(stream_post, pool, path, body, timeout=min(30.0, job.c.timeout_s), extra=extra)
    group.join(timeout=60)
    for label in target_labels(job.c) if n > 0 else ():   # --reset-cache: the warm-up's prompts out again
        url = job.c.target_of(label)
        if url in job.c.cache_resets:
            status, _, _ = http_call(url + job.c.cache_resets[url], "POST", os.environ.get(job.c.key_env_of(label) or ""))
            if not (isinstance(status, int) and 200 <= status < 300):
                print(f"replay: warning: cache reset after the warm-up: POST {url}{job.c.cache_resets[url]} -> "
                      f"{status}; its cache holds the warm-up's prompts", file=sys.stderr)


PRECONNECT_LEAD_S = 2.0   # distributed runs with --preconnect: T0 this much later (workers stop at T0)


def install_stop(out: Output, stop) -> None:
    """SIGINT/SIGTERM (and a failed write, through `out`): the first stops dispatching
    gracefully, a second one skips the grace."""
    out.stop = stop
    hits = []

    def handler():
        hits.append(1)
        stop(len(hits) > 1)
        if len(hits) > 2:  # a third one: give up on a clean finish
            os._exit(130)
    for sig in (signal.SIGINT, signal.SIGTERM):
        gevent.signal_handler(sig, handler)


def start_local(env, config: plan.RunConfig, out: Output) -> Job:
    """Prepare this process's Job (T0 = now + lead); Locust's runner then spawns the user."""
    ctx = env.replay = ProcessContext()
    # small chunks: turning rows into tuples runs in the hub, ~1.3 us a row, between two sends
    job = ctx.job = Job(config, 0, 0.0, plan.TraceWindow(config, batch_size=256).prefetch(),
                        out.recorder, env)
    warmup(job, config.warmup)
    preconnect(job, config.preconnect)
    out.progress.live = lambda: (job.sent, job.in_flight)
    freeze_gc()
    t0_wall = time.time() + config.lead_s
    job.t0 = perf_at(t0_wall)
    out.start(t0_wall, job.t0)
    ctx.ready.set()
    return job


def stop_job(job: Job, now: bool) -> None:
    if now:
        job.c.grace_s = 0.0
    try:   # a stop asked by `replay run` itself (--until-decided) says why in run.json
        job.stop_reason = json.loads((Path(job.c.run_dir) / "run.json").read_text()).get("stop_reason")
    except (OSError, ValueError):
        pass
    job.stop()


def run_local(env: Environment, config: plan.RunConfig, out: Output) -> str:
    runner = env.create_local_runner()
    job = start_local(env, config, out)
    install_stop(out, lambda now: stop_job(job, now))
    cpu0 = cpu_seconds()
    runner.start(1, spawn_rate=1)
    job.finished.wait()
    # the client's own CPU over the run (T0 lead included, start-up and finalising not)
    update_run_json(config.run_dir, client_cpu_s=round(cpu_seconds() - cpu0, 3), unsent_bulk=out.recorder.bulk)
    runner.quit()
    job.close()
    return "interrupted" if job.stopping else "completed"


def start_master(env, config: plan.RunConfig, out: Output) -> Master:
    """Ship setup, T0 and the first rows to every connected worker."""
    master = Master(config, env.runner, out)
    freeze_gc()
    # workers open their --preconnect share between setup and T0: give them time for it
    t0_wall = time.time() + max(config.lead_s, 2.0) + (PRECONNECT_LEAD_S if config.preconnect > 0 else 0.0)
    out.start(t0_wall, perf_at(t0_wall))
    master.start(t0_wall)
    return master


class SetupError(RuntimeError):
    """The distributed run could not start: one `error:` line, no traceback."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_distributed(env: Environment, config: plan.RunConfig, out: Output) -> str:
    port = config.master_port or _free_port()
    bind = config.master_host if config.remote_workers else "127.0.0.1"
    runner = env.create_master_runner(master_bind_host=bind, master_bind_port=port)
    # local workers reach the master where it listens: loopback only if it binds a wildcard
    local = "127.0.0.1" if bind in ("", "*", "0.0.0.0") else bind
    procs = [subprocess.Popen([sys.executable, "-m", "llm_replay.replay.worker", "--master", f"{local}:{port}",
                               "--die-with-parent"]) for _ in range(config.workers)]
    want = config.workers + config.remote_workers
    if config.remote_workers:
        print(f"replay: waiting for {config.remote_workers} remote worker(s): "
              f"replay worker --master {socket.gethostname()}:{port}", file=sys.stderr)
    deadline = time.monotonic() + 60 + (600 if config.remote_workers else 0)
    while len(runner.clients.ready) < want:
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            runner.quit()
            _reap(procs)
            dead = [p.returncode for p in procs if p.poll() is not None]
            raise SetupError(f"only {len(runner.clients.ready)} of {want} workers connected" +
                             (f" ({len(dead)} local worker(s) exited with {', '.join(map(str, dead))} before "
                              "connecting)" if dead else " within the time allowed"))
        gevent.sleep(0.05)
    runner.start(want, spawn_rate=50 * want)  # users first: T0 must not race Locust's spawning
    while len(runner.clients.running) < want:
        if time.monotonic() > deadline:
            raise SetupError("workers did not start their users")
        gevent.sleep(0.05)
    cpu0 = cpu_seconds()
    master = start_master(env, config, out)
    install_stop(out, master.stop)
    master.finished.wait()
    # master + every worker that reported (a lost worker's CPU is unknown)
    update_run_json(config.run_dir, client_cpu_s=round(cpu_seconds() - cpu0 + master.worker_cpu_s, 3),
                    unsent_bulk=out.recorder.bulk, **({"lost_workers": sorted(master.lost)} if master.lost else {}))
    runner.quit()
    _reap(procs)
    return "interrupted" if master.stopping else "completed"


def _reap(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


def main(argv: list[str] | None = None) -> int:
    die_with_parent()  # a SIGKILLed `replay run` takes its runner along (records stay flushed)
    run_dir = Path((argv or sys.argv[1:])[0])
    config = plan.RunConfig.from_json(json.loads((run_dir / "run.json").read_text())["config"])
    try:
        out = Output(config)
    except OSError as e:
        print(f"error: cannot write {e.filename or run_dir}: {os.strerror(e.errno) if e.errno else e}",
              file=sys.stderr)
        return UNWRITABLE
    status = "failed"
    try:
        env = Environment(user_classes=[Dispatcher], host=config.target or next(iter(config.targets.values())),
                          events=None)
        status = (run_distributed if config.workers > 1 or config.remote_workers else run_local)(env, config, out)
    except SetupError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:    # run.json at T0, say, on a full disk
        out.failed(e, e.filename or run_dir / "run.json")
    finally:
        counts = out.close()
        try:
            update_run_json(run_dir, status="failed" if out.error else status, status_counts=counts,
                            ended_wall=time.time(), **({"error": out.error} if out.error else {}))
        except OSError as e:
            out.failed(e, run_dir / "run.json")
    if out.error:   # the one line `replay run` shows (it exits 2)
        print(f"error: {out.error}", file=sys.stderr)
        return UNWRITABLE
    return 130 if status == "interrupted" else 0


if __name__ == "__main__":
    raise SystemExit(main())
