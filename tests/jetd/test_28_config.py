"""Config.validate (jetd/config.py, issue 28): one check a kind of setting, each naming
the setting; NaN is refused where a bound is."""

from __future__ import annotations

import math

import pytest

from jetd.config import Config
from jetd.config import ConfigError


@pytest.mark.parametrize(("name", "value", "says"), [
    ("first_frame_timeout", math.nan, "must not be negative"),
    ("auth_failure_delay", math.nan, "must not be negative"),
    ("shutdown_grace", -1.0, "must not be negative"),
    ("http_handshake_timeout", 0.0, "must be positive"),
    ("tls_handshake_timeout", math.nan, "must be positive"),
    ("route_timeout", -2.0, "must be positive"),
    ("auth_queue", 0, "must be at least 1"),
    ("log_writer_backlog", 0, "must be at least 1"),
    ("max_window", 0, "must be at least 1"),
])
def test_a_bad_setting_is_named(name: str, value: float, says: str) -> None:
    with pytest.raises(ConfigError, match=f"{name} {says}"):
        config = Config()
        setattr(config, name, value)
        config.validate()


def test_the_defaults_are_valid() -> None:
    assert Config().validate() == Config()
