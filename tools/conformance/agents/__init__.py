"""Agents of the peer conformance suite (spec/conformance/PEER.md): small programs that
drive one peer library through the agent script, ``python -m ... HOST PORT``.

``peer_async``, ``peer_sync`` and ``peer_tiny`` drive jet's own peers and must pass;
``broken`` holds deliberately wrong agents the suite must fail (its tests assert that).
"""
