"""How long one new fetch stalls the other peers: a health peer's worst GET latency while
another peer opens a plain FETCH, a filtered FETCH_QUERY or a sorted top-10 FETCH_QUERY
over N JSON states (issue 15: a query's seeding is not sliced yet).

    python -m tools.bench.query_stall --states 200000
"""

from __future__ import annotations

import argparse
import asyncio
import re
import subprocess
import sys
import time
from pathlib import Path

from peer import PeerAsync
from peer.query import field

REPO = Path(__file__).resolve().parents[2]


async def _one(kind: str, states: int) -> tuple[float, float]:
    daemon = subprocess.Popen(
        [sys.executable, "-m", "jetd", "--port", "0", "--max-states-per-connection", str(states + 10)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    try:
        assert daemon.stdout is not None
        found = re.search(r":(\d+)", daemon.stdout.readline())
        assert found is not None
        port = int(found.group(1))
        owner = await PeerAsync.connect("127.0.0.1", port, name="owner")
        for start in range(0, states, 5000):
            await asyncio.gather(*(owner.add_state(f"p/{i:07d}", {"score": i % 1000, "gender": "f" if i % 2 else "m"})
                                   for i in range(start, min(states, start + 5000))))
        health = await PeerAsync.connect("127.0.0.1", port, name="health")
        fetcher = await PeerAsync.connect("127.0.0.1", port, name="fetcher")
        worst = 0.0
        done = False

        async def probe() -> None:
            nonlocal worst
            while not done:
                began = time.perf_counter()
                await health.get("p/0000001")
                worst = max(worst, time.perf_counter() - began)
                await asyncio.sleep(0.001)

        task = asyncio.create_task(probe())
        await asyncio.sleep(0.2)
        began = time.perf_counter()
        if kind == "plain":
            await fetcher.fetch("p/")
        elif kind == "filtered":
            await fetcher.fetch("p/", where=[field("gender") == "f"])
        else:
            await fetcher.fetch("p/", where=[field("gender") == "f"], sort_by="score", descending=True, top=10)
        answered = time.perf_counter() - began
        await asyncio.sleep(1.0)
        done = True
        await task
        for peer in (owner, health, fetcher):
            await peer.close()
        return answered, worst
    finally:
        daemon.terminate()
        daemon.wait(10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--states", type=int, default=200_000)
    args = parser.parse_args(argv)
    print(f"| fetch over {args.states:,} states | answered in | worst health GET |\n|---|---|---|")
    for kind in ("plain", "filtered", "sorted top 10"):
        answered, worst = asyncio.run(_one(kind, args.states))
        print(f"| {kind} | {answered * 1000:.0f} ms | {worst * 1000:.0f} ms |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
