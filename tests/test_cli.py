"""The `replay` command itself: help works, bad usage exits 2 without a traceback."""
from tests.conftest import run_cli, wait_s


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


def test_a_reader_that_leaves_early_and_bad_slo_files_give_no_traceback(tmp_path):
    """Issue 23 item 2: `replay trace compare A B | head` ended in a BrokenPipeError traceback;
    a non-UTF-8 or deeply nested SLO file was a traceback with exit 1, which a CI gate reads as
    a failed objective."""
    import subprocess
    import sys

    from tests.conftest import repo_env
    from tests.replay.runkit import write_trace
    trace = write_trace(tmp_path / "t.parquet", 200, gap_s=0.01)
    p = subprocess.Popen([sys.executable, "-m", "llm_replay.replay", "trace", "compare", str(trace), str(trace)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=repo_env())
    p.stdout.close()                       # the reader is gone before the first line
    err = p.stderr.read().decode()
    assert p.wait(wait_s(60)) in (0, 141) and "Traceback" not in err and "BrokenPipe" not in err, err
    run = tmp_path / "run"
    run.mkdir()
    for name, body in (("bin.yaml", b"objectives: ['error_rate <= 0.1']\n\xff\xfe\x00"),
                       ("deep.yaml", b"a: " + b"[" * 20000 + b"]" * 20000 + b"\n"),
                       ("deep.toml", b"a = " + b"[" * 20000 + b"]" * 20000 + b"\n")):
        (tmp_path / name).write_bytes(body)
        g = run_cli("replay", "gate", run, "--slo", tmp_path / name)
        assert g.returncode == 2 and g.stderr.startswith("error: ") and g.stderr.count("\n") == 1, g.stderr


def test_hints_name_the_mistake():
    """A typo'd option is named with the option meant (it was reported as a missing --target);
    a duration names the accepted forms (it said 'invalid parse_duration value')."""
    p = run_cli("replay", "run", "--taget", "http://127.0.0.1:8000", "--trace", "t.parquet")
    assert p.returncode == 2 and "unrecognized argument --taget (did you mean --target?)" in p.stderr, p.stderr
    p = run_cli("replay", "run", "--trace", "t.parquet", "--target", "http://127.0.0.1:8000", "--duration", "5 mins")
    assert p.returncode == 2 and "not a duration: '5 mins'" in p.stderr and "5min" in p.stderr, p.stderr
    from llm_replay.replay.run_cmd import parse_duration
    assert [parse_duration(x) for x in ("5min", "1.5s", "500ms", "2m", "1h", "30")] == [300, 1.5, 0.5, 120, 3600, 30]


def test_a_csv_given_as_a_trace_says_how_to_import_it(tmp_path):
    """Issue 26 item 4: `replay run` on a CSV said 'not a readable Parquet file' and no more."""
    csv = tmp_path / "azure.csv"
    csv.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n")
    p = run_cli("replay", "run", "--trace", csv, "--target", "http://127.0.0.1:9")
    assert p.returncode == 2 and "not a readable Parquet file" in p.stderr, p.stderr
    assert "it looks like CSV: import it first, e.g. `replay trace import azure" in p.stderr, p.stderr
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(bytes(range(256)))
    p = run_cli("replay", "run", "--trace", junk, "--target", "http://127.0.0.1:9")
    assert p.returncode == 2 and "import it first" not in p.stderr, p.stderr


HEAVY = ("numpy", "pyarrow", "pandas", "scipy", "locust", "openai")


def _cli_in_process(*argv: str):
    """`replay ARGV` in a child python that reports, after it, which heavy packages it imported."""
    import subprocess
    import sys

    from tests.conftest import repo_env
    code = ("import sys\nfrom llm_replay.replay.cli import main\n"
            "try:\n    code = main(sys.argv[1:])\nexcept SystemExit as e:\n    code = e.code\n"
            f"print('HEAVY', *[m for m in {HEAVY!r} if m in sys.modules])\nsys.exit(code)")
    p = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, env=repo_env(), timeout=wait_s(120))
    heavy = p.stdout.rsplit("HEAVY", 1)[1].split()
    return p, heavy


def test_help_and_argument_errors_import_nothing_heavy():
    """Issue 36 item 8: `replay trace generate --preset chatt` imported numpy, pyarrow and scipy
    (8.5 s on a busy host) before refusing the typo; `replay --help` imported numpy and pyarrow."""
    p, heavy = _cli_in_process("--help")
    assert p.returncode == 0 and "trace" in p.stdout and heavy == [], (heavy, p.stderr)
    p, heavy = _cli_in_process("trace", "generate", "--preset", "chatt", "--duration", "60", "-o", "x.parquet")
    errors = [line for line in p.stderr.splitlines() if "error:" in line]
    assert p.returncode == 2 and len(errors) == 1 and "did you mean chat?" in errors[0], p.stderr
    assert heavy == [] and "Traceback" not in p.stderr, (heavy, p.stderr)
    p, heavy = _cli_in_process("run", "--url", "http://127.0.0.1:8000", "--trace", "t.parquet")
    assert p.returncode == 2 and "unrecognized argument --url (did you mean --target?)" in p.stderr, p.stderr
    assert heavy == [], heavy
    for argv, said in ((["trace", "describe", "nosuch.parquet"], "error: nosuch.parquet: file not found"),
                       (["run", "--trace", "nosuch.parquet", "--target", "http://127.0.0.1:9"], "file not found"),
                       (["report", "nosuch"], "error: nosuch: no such file or run directory")):
        p, heavy = _cli_in_process(*argv)     # a missing input file is said before the analysis imports
        assert p.returncode == 2 and said in p.stderr and "Traceback" not in p.stderr, p.stderr
        assert heavy == [], (argv, heavy)
