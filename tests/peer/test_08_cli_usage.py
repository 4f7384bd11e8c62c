"""``jet`` as a new user meets it (issue 18): options anywhere, exit 2 for bad arguments
without a traceback, errors that say what to do, values from stdin or a file,
``serve-method`` and a typed ``serve-state``. Each runs the real CLI against a real jetd."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from test_05_cli import ENV
from test_05_cli import REPO
from test_05_cli import Streaming

from peer import Peer
from peer import Rejected


def run_jet(*args: str, stdin: str | None = None, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    """``jet ARGS`` with nothing added: the options go where the test puts them."""
    env = {key: value for key, value in ENV.items() if key not in ("JET_HOST", "JET_PORT")}
    return subprocess.run(
        [sys.executable, "-m", "peer.cli", *args], input=stdin, capture_output=True, text=True,
        env=env, timeout=timeout, cwd=REPO,
    )


def assert_usage_error(proc: subprocess.CompletedProcess[str], *words: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("jet"), proc.stderr
    for word in words:
        assert word in proc.stderr, (word, proc.stderr)


def test_global_options_after_the_command(jetd):
    port = str(jetd.port)
    with Peer(jetd.host, jetd.port) as owner:
        owner.add_state("plant/temp", 21.5)
        got = run_jet("get", "plant/temp", "--json", "--port", port, "--host", jetd.host)
        assert got.returncode == 0, got.stderr
        assert json.loads(got.stdout) == {"key": "plant/temp", "value": 21.5, "type": "FLOAT64"}
        fetched = run_jet("fetch", "--port", port, "plant/", "--count", "1", "--json", "--timeout", "10")
        assert fetched.returncode == 0, fetched.stderr
        assert json.loads(fetched.stdout)["key"] == "plant/temp"
        # Before the command they still work, and the command's value wins over the global.
        both = run_jet("--port", "1", "get", "plant/temp", "--port", port)
        assert both.returncode == 0 and both.stdout.strip() == "21.5", both.stderr


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--port", "99999", "get", "k"], ["--port", "99999"]),
        (["get", "k", "--port", "0"], ["--port"]),
        (["get", "k", "--port", "http"], ["--port"]),
        (["--timeout", "-1", "get", "k"], ["--timeout"]),
        (["get", "k", "--timeout", "nan"], ["--timeout"]),
        (["fetch", "x", "--count", "0"], ["--count"]),
        (["fetch", "x", "--sort-by", "key", "--top", "0"], ["--top"]),
        (["fetch", "x", "--timeout", "-2"], ["--timeout"]),
    ],
)
def test_bad_arguments_exit_2_with_one_line(args, words):
    assert_usage_error(run_jet(*args), *words)


def test_bad_jet_port_environment_exits_2():
    env = {**ENV, "JET_PORT": "70000"}
    proc = subprocess.run([sys.executable, "-m", "peer.cli", "get", "k"], capture_output=True, text=True,
                          env=env, timeout=20, cwd=REPO)
    assert_usage_error(proc, "JET_PORT")


def test_connection_refused_says_what_to_do():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = run_jet("--port", str(port), "get", "k")
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.strip() == f"jet: cannot connect to 127.0.0.1:{port}: is jetd running? (connection refused)"


def test_not_found_names_the_key(jetd):
    proc = run_jet("--port", str(jetd.port), "get", "no/such/key")
    assert proc.returncode == 4
    assert "no/such/key" in proc.stderr and "NOT_FOUND" in proc.stderr
    called = run_jet("--port", str(jetd.port), "call", "no/such/method")
    assert called.returncode == 4 and "no/such/method" in called.stderr


def test_broken_json_is_an_error_not_a_string(jetd):
    port = str(jetd.port)
    with Peer(jetd.host, jetd.port) as owner:
        owner.add_state("cfg", None, on_set=lambda value: value)
        broken = run_jet("--port", port, "set", "cfg", '{"a": 1')
        assert_usage_error(broken, "JSON", "--type string")
        assert owner.get("cfg") is None
        for text in ("[1, 2", '"unterminated'):
            assert run_jet("--port", port, "set", "cfg", text).returncode == 2
        as_text = run_jet("--port", port, "set", "cfg", '{"a": 1', "--type", "string")
        assert as_text.returncode == 0, as_text.stderr
        assert owner.get("cfg") == '{"a": 1'
        # Plain words are still strings.
        assert run_jet("--port", port, "set", "cfg", "hello world").returncode == 0
        assert owner.get("cfg") == "hello world"


def test_value_from_stdin_and_from_a_file(jetd, tmp_path: Path):
    port = str(jetd.port)
    big = "x" * 1_000_000
    with Peer(jetd.host, jetd.port) as owner:
        owner.add_state("blob", "", on_set=lambda value: value)
        from_stdin = run_jet("--port", port, "set", "blob", "-", "--type", "string", stdin=big)
        assert from_stdin.returncode == 0, from_stdin.stderr[-500:]
        assert owner.get("blob") == big
        path = tmp_path / "value.json"
        path.write_text('{"a": [1, 2]}\n')
        from_file = run_jet("--port", port, "set", "blob", f"@{path}")
        assert from_file.returncode == 0, from_file.stderr
        assert owner.get("blob") == {"a": [1, 2]}
        literal = run_jet("--port", port, "set", "blob", "@@home")
        assert literal.returncode == 0 and owner.get("blob") == "@home"
        missing = run_jet("--port", port, "set", "blob", f"@{tmp_path / 'nope'}")
        assert_usage_error(missing, "nope")
        owner.add_method("echo", lambda args: args)
        called = run_jet("--port", port, "call", "echo", "-", stdin="[1, 2, 3]")
        assert called.returncode == 0 and called.stdout.strip() == "[1, 2, 3]", called.stderr


def test_serve_method_with_a_fixed_result(jetd):
    served = Streaming(jetd, "serve-method", "svc/ping", "--result", '"pong"', "--json")
    try:
        with Peer(jetd.host, jetd.port) as client:
            _wait_registered(client, "svc/ping")
            assert client.call("svc/ping", {"n": 1}) == "pong"
            line = json.loads(served.line())
            assert line["event"] == "call" and line["key"] == "svc/ping" and line["args"] == {"n": 1}
    finally:
        code, err = served.stop()
    assert code == 130, err  # Ctrl-C (issue 32)


def test_serve_method_answers_with_a_command(jetd):
    script = "import json, sys; args = json.load(sys.stdin); sys.exit(3) if args == 'fail' else print(json.dumps(args * 2))"
    served = Streaming(jetd, "serve-method", "svc/double", "--", sys.executable, "-c", script)
    try:
        with Peer(jetd.host, jetd.port) as client:
            _wait_registered(client, "svc/double")
            assert client.call("svc/double", 21) == 42
            assert client.call("svc/double", [1]) == [1, 1]
            with pytest.raises(Rejected, match="exit status 3"):
                client.call("svc/double", "fail")
            assert "call" in served.line()
    finally:
        code, err = served.stop()
    assert code == 130, err  # Ctrl-C (issue 32)


def test_serve_method_usage_errors(jetd):
    assert_usage_error(run_jet("--port", str(jetd.port), "serve-method", "m", "--result", "1", "--", "true"),
                       "--result")


def test_serve_state_keeps_its_declared_type(jetd):
    served = Streaming(jetd, "serve-state", "dev/level", "3", "--type", "int")
    try:
        with Peer(jetd.host, jetd.port) as client:
            _wait_registered(client, "dev/level")
            assert client.set("dev/level", 7) == 7
            with pytest.raises(Rejected, match="int"):
                client.set("dev/level", "seven")
            with pytest.raises(Rejected):
                client.set("dev/level", 7.5)
            assert client.get("dev/level") == 7
    finally:
        code, err = served.stop()
    assert code == 130, err  # Ctrl-C (issue 32)
    served = Streaming(jetd, "serve-state", "dev/ratio", "0.5", "--type", "float")
    try:
        with Peer(jetd.host, jetd.port) as client:
            _wait_registered(client, "dev/ratio")
            got = client.set("dev/ratio", 2)  # an int is a float here
            assert got == 2.0 and isinstance(client.get("dev/ratio"), float)
            with pytest.raises(Rejected):
                client.set("dev/ratio", "x")
    finally:
        served.stop()


def _wait_registered(client: Peer, key: str) -> None:
    """Until KEY exists on the daemon (the CLI registers it after it starts)."""
    import time

    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if any(entry.key == key for entry in client.query(key, methods=True)):
            return
        time.sleep(0.05)
    raise AssertionError(f"{key} never registered")


def test_help_of_every_command_reads(jetd):
    for command in ("info", "get", "set", "call", "fetch", "ls", "serve-state", "serve-method"):
        proc = run_jet(command, "--help")
        assert proc.returncode == 0, (command, proc.stderr)
        assert "--port" in proc.stdout and "--json" in proc.stdout, command
    assert os.path.exists(REPO / "peer" / "cli.py")
