"""Chaos: issue 12's hostile and careless peers, at full size, against any jetd.

    python -m tools.chaos                         # every attack, a fresh jetd for each
    python -m tools.chaos --attack get-400 --scale 0.1
    python -m tools.chaos --connect 127.0.0.1:11124 --pid 4242 --json
    python -m tools.chaos --attack all-at-once --repo SITE   # issue 29: every scenario together, PASS/FAIL

Prints one row per attack: the daemon's RSS before and at its peak (VmRSS from
/proc/PID/status, sampled every 20 ms), the waits of a health peer that reads and sets
a state every 50 ms (max and p99), event-log losses, and what happened to the attackers.
Everything talks to 127.0.0.1 only; every wait has a timeout; every process and
connection it starts is stopped. Exit status 0 when every attack ran (whatever it
measured), 1 when one could not run.
"""
