"""Queries through the peers against a real jetd over TCP (PROTOCOL.md 14): the
scoreboard as a live sorted window, filters over their whole life, methods and nodes,
one-shot queries, errors."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from peer_testlib import run
from peer_testlib import two_peers

from peer import EventKind
from peer import InvalidQuery
from peer import Peer
from peer import field
from peer import key
from peer import value

REPO = Path(__file__).resolve().parents[2]


def test_scoreboard_top_three_stays_live(jetd):
    async def body():
        async with two_peers(jetd) as (owner, fan):
            players = {}
            for i in range(8):
                players[i] = await owner.add_state(
                    f"players/p{i}", {"name": f"p{i}", "gender": "female" if i % 2 else "male", "score": i}
                )
            board = fan.fetch("players/", where=[field("gender") == "female"], sort_by="score", descending=True, top=3)
            await board
            first = await board.__anext__()
            assert first.kind is EventKind.WINDOW
            assert [row.key for row in first.rows] == ["players/p7", "players/p5", "players/p3"]
            assert [row.index for row in first.rows] == [1, 2, 3]
            await players[1].notify({"name": "p1", "gender": "female", "score": 100})
            update = await asyncio.wait_for(board.__anext__(), 5)
            assert [row.key for row in update.rows] == ["players/p1", "players/p7", "players/p5"]
            assert [row.value["score"] for row in board.rows] == [100, 7, 5]
            await board.unfetch()

    run(body())


def test_filter_holds_for_the_life_of_the_fetch(jetd):
    async def body():
        async with two_peers(jetd) as (owner, fan):
            temp = await owner.add_state("plant/temp", 10)
            hot = fan.fetch(match=[key.ends_with("/temp")], where=[value > 30])
            await hot
            await temp.notify(35)
            await temp.notify(40)
            await temp.notify(20)
            kinds = [(await asyncio.wait_for(hot.__anext__(), 5)).kind for _ in range(3)]
            assert kinds == [EventKind.ADD, EventKind.CHANGE, EventKind.UNMATCH]

    run(body())


def test_methods_nodes_and_one_shot_queries_sync(jetd):
    with Peer(jetd.host, jetd.port) as owner, Peer(jetd.host, jetd.port) as asker:
        owner.add_state("plant/line1/temp", 21)
        owner.add_method("plant/line1/reset", lambda _: None)
        entries = asker.query("plant/", methods=True, nodes=True)
        assert [(e.kind, e.key) for e in entries] == [
            ("node", "plant/line1"),
            ("method", "plant/line1/reset"),
            ("state", "plant/line1/temp"),
        ]
        assert entries[2].value == 21
        with asker.fetch(match=[key.starts_with("PLANT").ignore_case()], nodes=True) as fetch:
            got = [fetch.next(timeout=5) for _ in range(3)]
            assert [(e.kind, e.key) for e in got] == [
                (EventKind.NODE_ADD, "plant"),
                (EventKind.NODE_ADD, "plant/line1"),
                (EventKind.ADD, "plant/line1/temp"),
            ]
        with pytest.raises(InvalidQuery):
            asker.query(where=[field("a") == 1], methods=True)
        assert asker.query(match=[~key.contains("line")]) == []


def _jet(daemon, *args: str) -> list[str]:
    cmd = [sys.executable, "-m", "peer.cli", "--host", daemon.host, "--port", str(daemon.port), *args]
    return cmd


def test_cli_scoreboard_ls_and_bad_where(jetd):
    with Peer(jetd.host, jetd.port) as owner:
        states = {
            i: owner.add_state(f"players/p{i}", {"name": f"p{i}", "gender": "female" if i % 2 else "male", "score": i})
            for i in range(6)
        }
        args = ["fetch", "players/", "--where", 'gender == "female"', "--sort-by", "score", "--desc", "--top", "2"]
        proc = subprocess.Popen(
            _jet(jetd, "--json", *args, "--count", "2", "--timeout", "20"), stdout=subprocess.PIPE, text=True, cwd=REPO
        )
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())
        assert first["event"] == "window"
        assert [(r["index"], r["key"], r["value"]["score"]) for r in first["rows"]] == [
            (1, "players/p5", 5),
            (2, "players/p3", 3),
        ]
        states[1].notify({"name": "p1", "gender": "female", "score": 4})
        second = json.loads(proc.stdout.readline())
        assert [r["key"] for r in second["rows"]] == ["players/p5", "players/p1"]
        assert proc.wait(timeout=20) == 0  # --count 2: two window updates, then exit
        # --timeout alone exits after the time given.
        quiet = subprocess.run(_jet(jetd, "fetch", "nothing/", "--timeout", "0.5"), capture_output=True, text=True, cwd=REPO, timeout=20)
        assert quiet.returncode == 0 and quiet.stdout == ""
        listed = subprocess.run(
            _jet(jetd, "ls", "players/", "--where", "score >= 4"), capture_output=True, text=True, cwd=REPO, timeout=20
        )
        assert listed.returncode == 0 and listed.stdout.split() == ["players/p1", "players/p4", "players/p5"]
        as_json = subprocess.run(_jet(jetd, "ls", "players/p5", "--json"), capture_output=True, text=True, cwd=REPO, timeout=20)
        assert json.loads(as_json.stdout)["value"]["score"] == 5
        bad = subprocess.run(_jet(jetd, "ls", "--where", "score ~ 3"), capture_output=True, text=True, cwd=REPO, timeout=20)
        assert bad.returncode == 2 and "FIELD OP JSONVALUE" in bad.stderr
