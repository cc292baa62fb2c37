"""``--config-file job.yaml``: a YAML mapping of flag -> value; command-line flags override it.

Keys: long flag names without dashes (``min-np``), their underscore spelling (``min_np``) or
the click parameter name (``np`` for ``-np/--num-proc``), derived from ``command.params``, so
options added to the CLI later work unchanged. Values: a scalar; a list for ``multiple``
options (a lone scalar is one item); an N-item list for N-value options
(``blacklist-cooldown-range: [10, 300]``); true/false for flags; ``null`` keeps the default.
Each value is converted with the option's click type on load, so errors name file and key.
``command:`` (a list of strings, or one string split like a shell does) is used when no
COMMAND is given on the command line. Relative paths of options of type ``click.Path``
(``hostfile: hosts.txt``) are resolved relative to the config file's directory; ``~`` expands.
"""

from __future__ import annotations

import datetime
import difflib
import os
import shlex
from pathlib import Path
from typing import Any

import click

from elasticrun.job.errors import ConfigError

MAX_BYTES = 1 << 20


def config_file_callback(ctx: click.Context, param: click.Parameter, value: Any) -> None:
    """Eager callback of ``--config-file``: the file's values become the options' defaults."""
    if value is not None:
        ctx.default_map = {**(ctx.default_map or {}), **load_config_file(Path(value), ctx.command)}


def load_config_file(path: Path, command: click.Command) -> dict[str, Any]:
    """The ``default_map`` (click parameter name -> converted value) that ``path`` gives."""
    data = _read_yaml(path)
    table = _accepted_keys(command)
    ctx = click.Context(command)
    base = path.expanduser().absolute().parent
    result: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for key, raw in data.items():
        if not isinstance(key, str):
            raise _error(path, f"key {_show(key)} is not a string")
        param = table.get(key.replace("_", "-"))
        if param is None:
            close = difflib.get_close_matches(key.replace("_", "-"), sorted(table), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise _error(path, f"unknown key {_show(key)}{hint}")
        assert param.name is not None
        if param.name in spelled:
            raise _error(path, f"{_show(spelled[param.name])} and {_show(key)} set the same option")
        spelled[param.name] = key
        if raw is None:
            continue
        if isinstance(param, click.Argument):
            result[param.name] = _command(path, key, raw)
            continue
        try:
            result[param.name] = param.type_cast_value(ctx, _shape(path, key, param, raw, base))
        except click.BadParameter as exc:
            raise _error(path, f"{key}: {exc.message}") from None
        except (TypeError, ValueError, OverflowError, AttributeError):
            raise _error(path, f"{key}: invalid value {_show(raw)}") from None
    return result


def _read_yaml(path: Path) -> dict[Any, Any]:
    try:
        with path.expanduser().open("rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise _error(path, f"cannot read config file: {exc.strerror or exc}") from None
    if len(raw) > MAX_BYTES:
        raise _error(path, f"config file is larger than {MAX_BYTES // 1024} KiB")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise _error(path, f"not UTF-8 text (byte {exc.start})") from None
    import yaml  # only a job started with a config file pays for its import

    try:
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        where = f" at line {exc.problem_mark.line + 1}" if exc.problem_mark else ""
        raise _error(path, f"invalid YAML{where}: {exc.problem or exc.context}") from None
    except (yaml.YAMLError, ValueError, TypeError, OverflowError) as exc:
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise _error(path, f"invalid YAML: {first}") from None
    except RecursionError:
        raise _error(path, "invalid YAML: nested too deeply") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise _error(path, f"expected a mapping of flag: value, got {_kind(data)}")
    return data


def _accepted_keys(command: click.Command) -> dict[str, click.Parameter]:
    """Dashed spelling of every accepted key -> its parameter."""
    table: dict[str, click.Parameter] = {}
    for param in command.params:
        if isinstance(param, click.Argument) and param.name == "command":
            table["command"] = param
        elif isinstance(param, click.Option) and param.expose_value and param.name:
            # --help, --version and --config-file itself do not pass a value: not accepted
            names = [param.name] + [o.lstrip("-") for o in param.opts if o.startswith("--")]
            table.update({n.replace("_", "-"): param for n in names})
    return table


def _shape(path: Path, key: str, param: click.Parameter, raw: Any, base: Path) -> Any:
    """``raw`` checked to have the shape ``param`` takes (scalar, N-list, list of those), with
    strings for ``click.Path`` types resolved against ``base``."""
    types = list(param.type.types) if isinstance(param.type, click.Tuple) else [param.type]
    bools = any(isinstance(t, click.types.BoolParamType) for t in types)

    def scalar(item: Any, ptype: click.ParamType) -> Any:
        if isinstance(item, bool) and not bools:
            raise _error(path, f"{key}: expected a value, got the boolean {item} (quote it)")
        if isinstance(item, (datetime.date, datetime.datetime)):
            item = item.isoformat()
        if not isinstance(item, (str, int, float)):
            raise _error(path, f"{key}: expected a single value, got {_kind(item)}")
        if isinstance(ptype, click.Path) and isinstance(item, str) and item not in ("", "-"):
            return str(base / os.path.expanduser(item))  # an absolute right side wins
        return item

    def one(item: Any) -> Any:
        if param.nargs == 1:
            return scalar(item, param.type)
        if not isinstance(item, list) or len(item) != param.nargs:
            raise _error(path, f"{key}: expected a list of {param.nargs} values, "
                               f"got {_kind(item)}")
        return [scalar(x, t) for x, t in zip(item, types * param.nargs, strict=False)]

    if param.multiple:
        return [one(item) for item in (raw if isinstance(raw, list) else [raw])]
    return one(raw)


def _command(path: Path, key: str, raw: Any) -> tuple[str, ...]:
    if isinstance(raw, str):
        try:
            words = shlex.split(raw)
        except ValueError as exc:
            raise _error(path, f"{key}: {exc}") from None
    elif isinstance(raw, list):
        words = raw
        for i, word in enumerate(words, 1):
            if not isinstance(word, str):
                raise _error(path, f"{key}: item {i} is {_kind(word)}, not a string (quote it)")
    else:
        raise _error(path, f"{key}: expected a list of strings or a string, got {_kind(raw)}")
    if not words:
        raise _error(path, f"{key}: is empty")
    return tuple(words)


def _kind(value: Any) -> str:
    names = {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean",
             int: "an integer", float: "a number", type(None): "null"}
    return names.get(type(value), f"a {type(value).__name__}")


def _show(value: Any) -> str:
    """Short one-line repr of a scalar (never of a container: it may be an alias bomb)."""
    if isinstance(value, (dict, list, set, tuple)):
        return _kind(value)
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**100 else "a huge number"
    return text if len(text) <= 60 else text[:57] + "..."


def _error(path: Path, message: str) -> ConfigError:
    return ConfigError(f"{path}: {message}")
