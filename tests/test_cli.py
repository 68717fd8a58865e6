"""The `replay` command itself: help works, bad usage exits 2 without a traceback."""
from tests.conftest import run_cli


def test_help_lists_trace_group():
    p = run_cli("replay", "--help", check=True)
    assert "trace" in p.stdout
    p = run_cli("replay", "trace", "--help", check=True)
    assert "TRACE_COMMAND" in p.stdout


def test_unknown_subcommand_is_usage_error():
    p = run_cli("replay", "no-such-command")
    assert p.returncode == 2
    assert "Traceback" not in p.stderr


def test_package_imports_stay_light():
    # importing the CLI must not pull in locust (gevent monkey-patching) or torch
    code = ("import sys, replay.cli; replay.cli.build_parser(); "
            "bad=[m for m in ('locust','gevent','torch') if m in sys.modules]; "
            "assert not bad, bad")
    p = run_cli("replay", "--version", check=True)
    assert "llm-replay" in p.stdout
    import subprocess, sys
    from tests.conftest import repo_env
    subprocess.run([sys.executable, "-c", code], env=repo_env(), check=True)
