"""Fuzz harnesses (atheris, OSS-Fuzz shape) for the jetwire decoders."""
