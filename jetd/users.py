"""jetd's users file: users, groups and the anonymous entry (PROTOCOL.md 15.1), and the
``jetd user add|del|list`` commands that edit it.

The file is TOML that people may also edit by hand::

    # Peers that do not authenticate (none of these lists: no permission at all).
    [anonymous]
    read = ["public/"]

    [groups.operators]
    read = [""]                 # "" is a prefix of every key
    write = ["plant/"]

    [users.boiler]
    password = "$argon2id$v=19$m=65536,t=3,p=4$..."
    own = ["plant/boiler/"]
    groups = ["operators"]

Each of ``own``, ``read`` and ``write`` is a list of key prefixes; a user's permissions
are the union of its own lists and those of its groups. Passwords are stored only as
argon2id hashes (argon2-cffi); a user without ``password`` can only authenticate with a
TLS client certificate whose CN is its name (PROTOCOL.md 15.6). ``jetd user add``
rewrites the file in this layout (comments are not kept).
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import os
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any
from typing import Optional

__all__ = ["Grants", "User", "UsersFile", "UsersFileError", "hash_password", "main", "verify_password"]

PERMISSIONS = ("own", "read", "write")
ANONYMOUS = "anonymous"
MAX_NAME = 255  # bytes of UTF-8: a user or group name


class UsersFileError(ValueError):
    """The users file cannot be read or does not follow the layout (the message says where)."""


@dataclass
class Grants:
    """The three prefix lists of a user, a group or the anonymous entry."""

    own: list[str] = field(default_factory=list)
    read: list[str] = field(default_factory=list)
    write: list[str] = field(default_factory=list)


@dataclass
class User(Grants):
    """One user: its argon2id ``password`` hash (None: certificate only) and ``groups``."""

    password: Optional[str] = None
    groups: list[str] = field(default_factory=list)


@dataclass
class UsersFile:
    """The parsed users file."""

    users: dict[str, User] = field(default_factory=dict)
    groups: dict[str, Grants] = field(default_factory=dict)
    anonymous: Grants = field(default_factory=Grants)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> UsersFile:
        """Read and check a users file.

        Raises:
            UsersFileError: unreadable file, invalid TOML, an unknown table or key, a
                wrong type, a password that is not an argon2id hash, an unknown group.
        """
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise UsersFileError(f"cannot read users file {path}: {exc.strerror or exc}") from None
        except UnicodeDecodeError as exc:
            raise UsersFileError(f"users file {path} is not UTF-8: {exc}") from None
        return cls.parse(text, str(path))

    @classmethod
    def parse(cls, text: str, where: str = "users file") -> UsersFile:
        """Parse the text of a users file (see :meth:`load`)."""
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise UsersFileError(f"{where} is not valid TOML: {exc}") from None
        result = cls()
        for top, value in data.items():
            if top not in ("users", "groups", ANONYMOUS):
                raise UsersFileError(f"{where}: unknown table [{top}] (expected [users.NAME], [groups.NAME], [anonymous])")
            if not isinstance(value, dict):
                raise UsersFileError(f"{where}: {top} must be a table")
        result.anonymous = _grants(data.get(ANONYMOUS, {}), f"{where} [anonymous]", Grants())
        for name, body in data.get("groups", {}).items():
            _check_name(name, f"{where}: group")
            if not isinstance(body, dict):
                raise UsersFileError(f"{where}: [groups.{name}] must be a table")
            result.groups[name] = _grants(body, f"{where} [groups.{name}]", Grants())
        for name, body in data.get("users", {}).items():
            _check_name(name, f"{where}: user")
            if name == ANONYMOUS:
                raise UsersFileError(f"{where}: 'anonymous' is reserved for the [anonymous] entry")
            if not isinstance(body, dict):
                raise UsersFileError(f"{where}: [users.{name}] must be a table")
            here = f"{where} [users.{name}]"
            user = _grants(dict(body), here, User(), extra=("password", "groups"))
            assert isinstance(user, User)
            password = body.get("password")
            if password is not None:
                if not isinstance(password, str) or not password.startswith("$argon2id$"):
                    raise UsersFileError(f"{here}: password must be an argon2id hash ('$argon2id$...'), never clear text")
                user.password = password
            groups = body.get("groups", [])
            if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
                raise UsersFileError(f"{here}: groups must be a list of strings")
            for group in groups:
                if group not in result.groups:
                    raise UsersFileError(f"{here}: unknown group {group!r}")
            user.groups = list(groups)
            result.users[name] = user
        return result

    def grants_of(self, name: Optional[str]) -> Grants:
        """The union of a user's lists and its groups' (the anonymous entry for None or
        an unknown name)."""
        user = self.users.get(name) if name is not None else None
        if user is None:
            return self.anonymous if name is None else Grants()
        merged = Grants(list(user.own), list(user.read), list(user.write))
        for group_name in user.groups:
            group = self.groups[group_name]
            merged.own += group.own
            merged.read += group.read
            merged.write += group.write
        return merged

    def dump(self) -> str:
        """The file's text in the canonical layout (what ``jetd user add`` writes)."""
        lines = ["# jetd users file (spec/PROTOCOL.md 15; jetd user add|del|list edits it)", ""]

        def lists(grants: Grants) -> None:
            for perm in PERMISSIONS:
                values = getattr(grants, perm)
                if values:
                    lines.append(f"{perm} = [{', '.join(_toml_str(v) for v in values)}]")

        lines.append(f"[{ANONYMOUS}]")
        lists(self.anonymous)
        lines.append("")
        for name, group in self.groups.items():
            lines.append(f"[groups.{_toml_str(name)}]")
            lists(group)
            lines.append("")
        for name, user in self.users.items():
            lines.append(f"[users.{_toml_str(name)}]")
            if user.password is not None:
                lines.append(f"password = {_toml_str(user.password)}")
            lists(user)
            if user.groups:
                lines.append(f"groups = [{', '.join(_toml_str(g) for g in user.groups)}]")
            lines.append("")
        return "\n".join(lines)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the file atomically (a reader sees the old or the new file, never half),
        readable by its owner only (it holds password hashes)."""
        target = Path(path)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent or ".")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(self.dump())
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(tmp, 0o600)
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


def _toml_str(text: str) -> str:
    """A TOML basic string (JSON's escapes are valid TOML escapes for these characters)."""
    out = ['"']
    for ch in text:
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _check_name(name: str, what: str) -> None:
    if not name or len(name.encode("utf-8")) > MAX_NAME:
        raise UsersFileError(f"{what} name must be 1..{MAX_NAME} UTF-8 bytes, got {name!r}")


def _grants(body: Any, where: str, into: Grants, extra: tuple[str, ...] = ()) -> Grants:
    if not isinstance(body, dict):
        raise UsersFileError(f"{where} must be a table")
    for key, value in body.items():
        if key in PERMISSIONS:
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise UsersFileError(f"{where}: {key} must be a list of key prefixes (strings)")
            for prefix in value:
                if len(prefix.encode("utf-8")) > 0xFFFF:
                    raise UsersFileError(f"{where}: a prefix in {key} is longer than 65535 bytes")
            setattr(into, key, list(value))
        elif key not in extra:
            allowed = ", ".join((*PERMISSIONS, *extra))
            raise UsersFileError(f"{where}: unknown key {key!r} (allowed: {allowed})")
    return into


def hash_password(password: str) -> str:
    """An argon2id hash of ``password`` (argon2-cffi's defaults, RFC 9106)."""
    from argon2 import PasswordHasher

    return PasswordHasher().hash(password)


def verify_password(stored: str, password: str) -> bool:
    """True if ``password`` matches the argon2id hash ``stored``; computed on the calling
    thread alone, with the hash's own parameters (memory, passes, lanes: never weaker).

    argon2-cffi's ``PasswordHasher.verify`` runs one thread per lane (4 at the default
    cost), so a single check takes every core of a 2-core machine and leaves none to
    jetd's event loop (issue 29). The lanes are a parameter of the hash, not of how it
    is computed: libargon2 fills them one after another when given one thread, with the
    same result (RFC 9106 3.2). So jetd bounds the cores its checks take by how many run
    at once (``jetd.access.checks_at_once``).

    Raises:
        ValueError: ``stored`` is not an argon2id hash (argon2-cffi's ``InvalidHashError``
            is one).
    """
    import base64
    import hmac

    from argon2 import Type
    from argon2 import extract_parameters
    from argon2.low_level import ffi
    from argon2.low_level import lib  # type: ignore[attr-defined]  # re-exported by argon2-cffi, untyped

    params = extract_parameters(stored)  # checks the form: $argon2id$v=19$m=..,t=..,p=..$salt$hash
    if params.type is not Type.ID:
        raise ValueError("not an argon2id hash")
    try:
        salt, expected = (base64.b64decode(part + "=" * (-len(part) % 4), validate=True)
                          for part in stored.rsplit("$", 2)[1:])
    except ValueError as exc:  # binascii.Error
        raise ValueError(f"not an argon2id hash: {exc}") from None
    secret = password.encode("utf-8")
    out = ffi.new("uint8_t[]", len(expected))
    c_pwd = ffi.new("uint8_t[]", max(1, len(secret)))
    ffi.memmove(c_pwd, secret, len(secret))
    c_salt = ffi.new("uint8_t[]", max(1, len(salt)))
    ffi.memmove(c_salt, salt, len(salt))
    context = ffi.new("argon2_context *", {
        "version": params.version, "out": out, "outlen": len(expected),
        "pwd": c_pwd, "pwdlen": len(secret), "salt": c_salt, "saltlen": len(salt),
        "secret": ffi.NULL, "secretlen": 0, "ad": ffi.NULL, "adlen": 0,
        "t_cost": params.time_cost, "m_cost": params.memory_cost,
        "lanes": params.parallelism, "threads": 1,  # the whole point: see above
        "allocate_cbk": ffi.NULL, "free_cbk": ffi.NULL, "flags": lib.ARGON2_DEFAULT_FLAGS,
    })
    # cffi releases the GIL during the call: the loop runs on meanwhile.
    if lib.argon2_ctx(context, Type.ID.value) != lib.ARGON2_OK:
        raise ValueError("not a valid argon2id hash (its parameters are out of range)")
    return hmac.compare_digest(bytes(ffi.buffer(out, len(expected))), expected)


# --- jetd user add|del|list ------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jetd user", description="Edit a jetd users file (jetd --auth FILE).")
    sub = parser.add_subparsers(dest="command", required=True)
    add = sub.add_parser("add", help="add a user, or replace it (password and lists)")
    add.add_argument("file", metavar="FILE")
    add.add_argument("name", metavar="NAME")
    add.add_argument("--own", action="append", default=[], metavar="PREFIX", help="keys it may register (where it may also read)")
    add.add_argument("--read", action="append", default=[], metavar="PREFIX", help="keys it may get and fetch")
    add.add_argument("--write", action="append", default=[], metavar="PREFIX", help="keys it may set and call (where it may also read)")
    add.add_argument("--group", action="append", default=[], metavar="GROUP", help="a group it belongs to")
    add.add_argument("--password-stdin", action="store_true", help="read the password from the first line of stdin")
    delete = sub.add_parser("del", help="delete a user")
    delete.add_argument("file", metavar="FILE")
    delete.add_argument("name", metavar="NAME")
    listing = sub.add_parser("list", help="list the users, their groups and permissions")
    listing.add_argument("file", metavar="FILE")
    return parser


def _read_password(from_stdin: bool) -> str:
    if from_stdin:
        line = sys.stdin.readline()
        password = line[:-1] if line.endswith("\n") else line
        if not password:
            raise UsersFileError("no password on stdin")
        return password
    if not sys.stdin.isatty():
        raise UsersFileError("stdin is not a terminal: use --password-stdin")
    first = getpass.getpass("password: ")
    second = getpass.getpass("password again: ")
    if first != second:
        raise UsersFileError("the passwords differ")
    if not first:
        raise UsersFileError("empty password")
    return first


def main(argv: list[str]) -> int:
    """``jetd user add|del|list``; returns the exit code (0 done, 2 bad input or file)."""
    args = _parser().parse_args(argv)
    try:
        path = Path(args.file)
        if args.command == "add":
            users = UsersFile.load(path) if path.exists() else UsersFile()
            _check_name(args.name, "user")
            if args.name == ANONYMOUS:
                raise UsersFileError("'anonymous' is reserved: edit the [anonymous] entry of the file instead")
            for group in args.group:
                if group not in users.groups:
                    raise UsersFileError(f"unknown group {group!r}: add [groups.{group}] to {path} first")
            password = _read_password(args.password_stdin)
            users.users[args.name] = User(
                own=args.own, read=args.read, write=args.write, password=hash_password(password), groups=args.group
            )
            users.save(path)
            print(f"user {args.name} saved in {path}")
        elif args.command == "del":
            users = UsersFile.load(path)
            if args.name not in users.users:
                raise UsersFileError(f"no user {args.name!r} in {path}")
            del users.users[args.name]
            users.save(path)
            print(f"user {args.name} deleted from {path}")
        else:
            users = UsersFile.load(path)

            def show(values: list[str]) -> str:
                return " ".join(repr(v) for v in values) or "-"

            for name, user in users.users.items():
                grants = users.grants_of(name)
                login = "password" if user.password else "certificate only"
                print(
                    f"{name}: {login}; groups {show(user.groups)}; own {show(grants.own)}; "
                    f"read {show(grants.read)}; write {show(grants.write)}"
                )
            anon = users.anonymous
            print(f"(anonymous): own {show(anon.own)}; read {show(anon.read)}; write {show(anon.write)}")
    except UsersFileError as exc:
        print(f"jetd user: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"jetd user: error: {exc.strerror or exc}: {args.file}", file=sys.stderr)
        return 2
    return 0
