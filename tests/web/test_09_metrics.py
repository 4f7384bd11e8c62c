"""09-metrics: ``/metrics`` on the HTTP port in Prometheus' text format (issue 33), from
a real jetd on 127.0.0.1, parsed with prometheus-client's own parser."""

from __future__ import annotations

import base64
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from jetwire import AddState
from jetwire import Authenticate
from jetwire import FetchStates
from jetwire import Request
from jetwire import Response
from jetwire import SetState
from jetwire import Status
from jetwire import Value
from tests.conftest import REPO
from tests.conftest import DaemonProcess
from tests.jetd.jetd_testlib import RawPeer
from tests.jetd.test_14_security import write_users
from tests.web.webtest import WsPeer
from tests.web.webtest import start_web_jetd
from tests.web.webtest import web_address

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(daemon: DaemonProcess, path: str = "/metrics", headers: dict[str, str] | None = None) -> tuple[int, str]:
    host, port = web_address(daemon)
    request = urllib.request.Request(f"http://{host}:{port}{path}", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=15) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def samples(daemon: DaemonProcess) -> Samples:
    status, text = scrape(daemon)
    assert status == 200, text
    found: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return found


def value(found: Samples, name: str, **labels: str) -> float:
    return found.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_parse_and_move_with_traffic(start_jetd: Callable[..., DaemonProcess]) -> None:
    daemon = start_web_jetd(start_jetd)
    before = samples(daemon)
    assert value(before, "jetd_connections", transport="tcp", authenticated="false") == 0
    assert ("jetd_resident_memory_bytes", ()) in before and value(before, "jetd_resident_memory_bytes") > 1e6
    with RawPeer(daemon.address, "owner") as owner, RawPeer(daemon.address, "client") as client:
        assert owner.request(lambda i: AddState(i, "plant/t", Value.of(1))).status == Status.OK
        assert client.request(lambda i: FetchStates(i, "plant/")).status == Status.OK
        client.recv()  # the initial FETCH_ADD
        rid = client.next_id()
        client.send(SetState(rid, "plant/t", Value.of(2)))
        routed = owner.recv()
        assert isinstance(routed, Request)
        owner.send(Response(routed.id, Status.OK))
        answer, _ = client.recv_until(lambda m: isinstance(m, Response) and m.id == rid)
        assert answer.status == Status.OK  # type: ignore[attr-defined]
        browser = WsPeer(web_address(daemon), "browser")
        try:
            after = samples(daemon)
        finally:
            browser.close()
    assert value(after, "jetd_connections", transport="tcp", authenticated="false") == 2
    assert value(after, "jetd_connections", transport="websocket", authenticated="false") == 1
    assert value(after, "jetd_fetches") == 1 and value(after, "jetd_states") >= 1
    ok = value(after, "jetd_route_latency_seconds_count", status="OK")
    assert ok == value(before, "jetd_route_latency_seconds_count", status="OK") + 1
    assert value(after, "jetd_route_latency_seconds_bucket", status="OK", le="+Inf") == ok
    # The times are the loop's (uvloop: 1 ms resolution), so a fast answer may take 0 s.
    assert 0 <= value(after, "jetd_route_latency_seconds_sum", status="OK") < 15
    assert value(after, "jetd_routed_total") == 1
    assert value(after, "jetd_frames_in_total", frame="request", function="SET_STATE") == 1
    assert value(after, "jetd_frames_in_total", frame="request", function="ADD_STATE") == 1
    assert value(after, "jetd_frames_in_total", frame="response", function="") == 1
    assert value(after, "jetd_bytes_in_total") > value(before, "jetd_bytes_in_total")
    assert value(after, "jetd_bytes_out_total") > value(before, "jetd_bytes_out_total")


def test_a_route_timeout_and_a_gone_owner_are_counted(start_jetd: Callable[..., DaemonProcess]) -> None:
    daemon = start_web_jetd(start_jetd, "--route-timeout", "0.5")
    with RawPeer(daemon.address, "client") as client:
        with RawPeer(daemon.address, "owner") as owner:
            assert owner.request(lambda i: AddState(i, "slow", Value.of(1))).status == Status.OK
            assert owner.request(lambda i: AddState(i, "gone", Value.of(1))).status == Status.OK
            timed_out = client.request(lambda i: SetState(i, "slow", Value.of(2)), timeout=15)
            assert timed_out.status == Status.TIMEOUT
            rid = client.next_id()
            client.send(SetState(rid, "gone", Value.of(2)))
            owner.recv_until(lambda m: isinstance(m, Request) and m.key == "gone")  # type: ignore[attr-defined]
        answer, _ = client.recv_until(lambda m: isinstance(m, Response) and m.id == rid, 15)
        assert answer.status == Status.OWNER_GONE  # type: ignore[attr-defined]
    found = samples(daemon)
    assert value(found, "jetd_route_timeouts_total") == 1 and value(found, "jetd_owners_gone_total") == 1
    assert value(found, "jetd_route_latency_seconds_count", status="TIMEOUT") == 1
    assert value(found, "jetd_route_latency_seconds_count", status="OWNER_GONE") == 1
    assert value(found, "jetd_route_latency_seconds_sum", status="TIMEOUT") >= 0.5


def _users(tmp_path: Path) -> Path:
    users = {"ops": {"password": "o-pw", "read": ["$jet/"]}, "plant": {"password": "p-pw", "read": ["plant/"]}}
    return write_users(tmp_path / "users.toml", users)


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_under_auth_metrics_are_refused_unless_public(start_jetd: Callable[..., DaemonProcess], tmp_path: Path) -> None:
    users = _users(tmp_path)
    closed = start_web_jetd(start_jetd, "--auth", str(users))
    status, text = scrape(closed)
    assert status == 401 and "$jet/" in text
    assert scrape(closed, "/registry.json")[0] == 403  # the same rule as the registry
    # A user with read on $jet/ (HTTP Basic), and users without it or with a wrong password.
    assert scrape(closed, headers=basic("plant", "p-pw"))[0] == 403
    assert scrape(closed, headers=basic("ops", "wrong"))[0] == 403
    assert scrape(closed, headers=basic("nobody", "o-pw"))[0] == 403
    for _ in range(2):  # the second time from the remembered check
        status, text = scrape(closed, headers=basic("ops", "o-pw"))
        assert status == 200 and "jetd_connections" in text
    assert scrape(closed, headers={"Authorization": "Basic !!"})[0] == 401
    public = start_web_jetd(start_jetd, "--auth", str(users), "--metrics-public", "--auth-failure-delay", "0.1")
    with RawPeer(public.address) as peer:
        failed = peer.request(lambda i: Authenticate(i, "ops", "wrong"), timeout=15)
        assert failed.status == Status.AUTH_FAILED
        found = samples(public)
        assert value(found, "jetd_auth_failures_total") == 1
        assert value(found, "jetd_connections", transport="tcp", authenticated="false") == 1
        assert peer.request(lambda i: Authenticate(i, "ops", "o-pw"), timeout=15).status == Status.OK
        found = samples(public)
        assert value(found, "jetd_connections", transport="tcp", authenticated="true") == 1
    # Without --auth /metrics is served like /registry.json.
    assert scrape(start_web_jetd(start_jetd))[0] == 200


def test_help_documents_metrics_public() -> None:
    done = subprocess.run([sys.executable, "-m", "jetd", "--help"], capture_output=True, text=True, cwd=REPO,
                          timeout=60)
    assert done.returncode == 0 and "--metrics-public" in done.stdout
    assert "/metrics" in " ".join(done.stdout.split())


def test_event_log_figures(start_jetd: Callable[..., DaemonProcess], tmp_path: Path) -> None:
    daemon = start_web_jetd(start_jetd, "--log-dir", str(tmp_path / "log"), "--log-fsync", "always")
    with RawPeer(daemon.address, "owner") as owner:
        assert owner.request(lambda i: AddState(i, "logged", Value.of(1)), timeout=15).status == Status.OK
        found = samples(daemon)
    assert value(found, "jetd_event_log_bytes_total") > 0
    assert value(found, "jetd_event_log_fsync_seconds_count") >= 1
    assert value(found, "jetd_event_log_fsync_seconds_bucket", le="+Inf") == value(
        found, "jetd_event_log_fsync_seconds_count")
    assert value(found, "jetd_event_log_errors_total") == 0
