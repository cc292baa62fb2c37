"""Unit tests for discovery plugins: spec parsing, loading by name and by module path, the
built-in factories, WebhookDiscovery's push semantics and HostfileDiscovery's re-reading."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from elasticrun.discovery.hostfile import HostfileDiscovery
from elasticrun.discovery.plugins import (
    ENTRY_POINT_GROUP,
    DiscoveryOptions,
    DiscoverySpec,
    available,
    load_discovery,
    parse_spec,
)
from elasticrun.discovery.script import ScriptDiscovery
from elasticrun.discovery.static import StaticDiscovery
from elasticrun.discovery.webhook import PushableDiscovery, WebhookDiscovery
from elasticrun.job import plugins
from elasticrun.job.errors import ConfigError, DiscoveryError

BUILTINS = ["hostfile", "script", "static", "webhook"]
OPTIONS = DiscoveryOptions(arg="ignored", slots_per_host=3, timeout=7.0)
PKG = "er_test_plugpkg"


def config_error(spec: str, options: DiscoveryOptions = OPTIONS) -> str:
    with pytest.raises(ConfigError) as info:
        load_discovery(spec, options)
    message = str(info.value)
    assert message and "\n" not in message
    return message


# --------------------------------------------------------------------------- parse_spec


@pytest.mark.parametrize(
    ("spec", "target", "arg", "by_module"),
    [
        ("script:/a/b", "script", "/a/b", False),
        ("static:h1:2,h2:4", "static", "h1:2,h2:4", False),
        ("webhook", "webhook", None, False),
        ("webhook:", "webhook", "", False),
        ("  webhook  ", "webhook", None, False),
        ("pkg.mod:make", "pkg.mod:make", None, True),
        ("pkg.mod:make:ARG:with:colons", "pkg.mod:make", "ARG:with:colons", True),
    ],
)
def test_parse_spec(spec: str, target: str, arg: str | None, by_module: bool) -> None:
    parsed = parse_spec(spec)
    assert parsed == DiscoverySpec(target, arg)
    assert parsed.by_module is by_module


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("", "expected NAME[:ARG] or module.path:factory[:ARG]"),
        (":x", "expected NAME[:ARG] or module.path:factory[:ARG]"),
        ("pkg.mod", "a module path needs its factory, e.g. 'pkg.mod:make'"),
        ("pkg.mod:1bad", "'1bad' is not a Python name"),
        ("pkg.mod:", "'' is not a Python name"),
    ],
)
def test_parse_spec_errors(spec: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_spec(spec)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"--discovery {spec!r}: ")
    assert fragment in message


# --------------------------------------------------------------------------- by name


def test_available_lists_the_builtins() -> None:
    names = available()
    assert set(BUILTINS) <= set(names)
    assert names == sorted(set(names))


def test_builtins_are_registered_as_entry_points() -> None:
    values = {ep.name: ep.value for ep in plugins.entry_points(group=ENTRY_POINT_GROUP)}
    for name in BUILTINS:
        assert values[name] == f"elasticrun.discovery.{name}:plugin"


async def test_load_static_by_name() -> None:
    discovery = load_discovery("static:h1:2,h2", OPTIONS)
    assert isinstance(discovery, StaticDiscovery)
    assert await discovery.find_hosts() == {"h1": 2, "h2": 3}


async def test_load_webhook_by_name_with_and_without_initial_hosts() -> None:
    empty = load_discovery("webhook", OPTIONS)
    assert isinstance(empty, WebhookDiscovery)
    assert await empty.find_hosts() == {}
    seeded = load_discovery("webhook:a:4,b,[fe80::1]:2", OPTIONS)
    assert isinstance(seeded, WebhookDiscovery)
    assert await seeded.find_hosts() == {"a": 4, "b": 3, "fe80::1": 2}
    assert seeded.describe() == "host-change webhook"


def test_load_webhook_bad_initial_hosts() -> None:
    assert config_error("webhook:a:zz") == (
        "--discovery webhook:a:zz: initial hosts: 'a:zz': slots must be a whole number >= 0, "
        "got 'zz'")


def test_load_hostfile_by_name(tmp_path: Path) -> None:
    path = tmp_path / "hosts"
    discovery = load_discovery(f"hostfile:{path}", OPTIONS)
    assert isinstance(discovery, HostfileDiscovery)
    assert discovery.describe() == f"hostfile {path}"


def test_load_script_by_name(tmp_path: Path) -> None:
    script = tmp_path / "hosts.sh"
    script.write_text("#!/bin/sh\necho a:1\n")
    script.chmod(0o755)
    discovery = load_discovery(f"script:{script}", OPTIONS)
    assert isinstance(discovery, ScriptDiscovery)
    assert discovery.describe() == f"discovery script {script}"


def test_load_script_that_does_not_exist(tmp_path: Path) -> None:
    missing = tmp_path / "nope.sh"
    assert config_error(f"script:{missing}") == (
        f"--discovery script:{missing}: the plugin failed to start: DiscoveryError: "
        f"discovery script {missing}: no such file")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("static", "--discovery static: expected static:HOST:SLOTS[,HOST:SLOTS...]"),
        ("static:", "--discovery static:: expected static:HOST:SLOTS[,HOST:SLOTS...]"),
        ("hostfile", "--discovery hostfile: expected hostfile:PATH"),
        ("script", "--discovery script: expected script:PATH"),
    ],
)
def test_builtin_without_arg(spec: str, message: str) -> None:
    assert config_error(spec) == message


def test_static_bad_hosts() -> None:
    assert config_error("static:a:-1") == (
        "--discovery static:a:-1: 'a:-1': slots must be a whole number >= 0, got '-1'")


def test_unknown_name_lists_installed_plugins() -> None:
    message = config_error("nosuchplugin")
    assert message == (f"--discovery: no discovery plugin named 'nosuchplugin' "
                       f"(installed: {', '.join(available())})")
    for name in BUILTINS:
        assert name in message


def test_entry_point_that_cannot_load(monkeypatch: pytest.MonkeyPatch) -> None:
    broken = EntryPoint(name="broken", value="er_no_such_module_xyz:make",
                        group=ENTRY_POINT_GROUP)
    monkeypatch.setattr(plugins, "entry_points", lambda group: [broken])
    assert config_error("broken") == (
        "--discovery broken: cannot load er_no_such_module_xyz:make: ModuleNotFoundError: "
        "No module named 'er_no_such_module_xyz'")


# --------------------------------------------------------------------------- by module path

PLUGIN_MODULE = """
from elasticrun.job.errors import ConfigError

class Found:
    def __init__(self, options):
        self.options = options

    async def find_hosts(self):
        return {"p": 1}

    def describe(self):
        return "test plugin"

def make(options):
    return Found(options)

def boom(options):
    raise RuntimeError("cloud said no")

def refuse(options):
    raise ConfigError("needs a region")

def not_discovery(options):
    return 42

NOT_CALLABLE = 1
"""


@pytest.fixture
def plugin_pkg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    pkg = tmp_path / PKG
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text(PLUGIN_MODULE)
    (pkg / "broken.py").write_text("raise ImportError('needs the cloud sdk')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield PKG
    for name in [n for n in sys.modules if n == PKG or n.startswith(PKG + ".")]:
        del sys.modules[name]


async def test_load_by_module_path(plugin_pkg: str) -> None:
    discovery = load_discovery(f"{plugin_pkg}.mod:make:zone:a:b", OPTIONS)
    assert type(discovery).__name__ == "Found"
    # The factory gets the ARG from the spec, not the one passed in, and the job's settings.
    assert discovery.options == DiscoveryOptions("zone:a:b", 3, 7.0)  # type: ignore[attr-defined]
    assert await discovery.find_hosts() == {"p": 1}


def test_load_by_module_path_without_arg(plugin_pkg: str) -> None:
    discovery = load_discovery(f"{plugin_pkg}.mod:make", OPTIONS)
    assert discovery.options == DiscoveryOptions(None, 3, 7.0)  # type: ignore[attr-defined]


def test_factory_raising_arbitrary_exception(plugin_pkg: str) -> None:
    spec = f"{plugin_pkg}.mod:boom"
    assert config_error(spec) == (
        f"--discovery {spec}: the plugin failed to start: RuntimeError: cloud said no")


def test_factory_raising_config_error(plugin_pkg: str) -> None:
    spec = f"{plugin_pkg}.mod:refuse"
    assert config_error(spec) == f"--discovery {spec}: needs a region"


def test_factory_returning_no_discovery(plugin_pkg: str) -> None:
    spec = f"{plugin_pkg}.mod:not_discovery"
    assert config_error(spec) == (
        f"--discovery {spec}: the factory returned int, which has no find_hosts()")


@pytest.mark.parametrize("attribute", ["missing", "NOT_CALLABLE"])
def test_module_without_callable_factory(plugin_pkg: str, attribute: str) -> None:
    assert config_error(f"{plugin_pkg}.mod:{attribute}") == (
        f"--discovery {plugin_pkg}.mod:{attribute}: {plugin_pkg}.mod has no callable "
        f"{attribute!r}")


def test_module_that_fails_to_import(plugin_pkg: str) -> None:
    assert config_error(f"{plugin_pkg}.broken:make") == (
        f"--discovery {plugin_pkg}.broken:make: cannot import {plugin_pkg}.broken: "
        f"ImportError: needs the cloud sdk")


def test_module_that_does_not_exist() -> None:
    assert config_error("er_no_such_pkg_xyz.mod:make") == (
        "--discovery er_no_such_pkg_xyz.mod:make: cannot import er_no_such_pkg_xyz.mod: "
        "ModuleNotFoundError: No module named 'er_no_such_pkg_xyz'")


# --------------------------------------------------------------------------- WebhookDiscovery


async def test_webhook_set_replaces_in_given_order() -> None:
    discovery = WebhookDiscovery({"a": 1, "b": 2})
    discovery.set_hosts({"c": 4, "a": 3})
    hosts = await discovery.find_hosts()
    assert list(hosts.items()) == [("c", 4), ("a", 3)]


async def test_webhook_add_appends_new_and_updates_known_in_place() -> None:
    discovery = WebhookDiscovery({"a": 1, "b": 2})
    discovery.add_hosts({"c": 5, "a": 7})
    assert list((await discovery.find_hosts()).items()) == [("a", 7), ("b", 2), ("c", 5)]


async def test_webhook_remove_returns_only_removed() -> None:
    discovery = WebhookDiscovery({"a": 1, "b": 2, "c": 3})
    assert discovery.remove_hosts(["c", "zz", "a"]) == ["c", "a"]
    assert await discovery.find_hosts() == {"b": 2}
    assert discovery.remove_hosts(["a"]) == []


async def test_webhook_copies_in_and_out() -> None:
    initial = {"a": 1}
    discovery = WebhookDiscovery(initial)
    initial["b"] = 2
    found = await discovery.find_hosts()
    found["c"] = 3
    assert await discovery.find_hosts() == {"a": 1}
    pushed = {"x": 1}
    discovery.set_hosts(pushed)
    pushed["y"] = 2
    assert await discovery.find_hosts() == {"x": 1}


def test_pushable_protocol() -> None:
    assert isinstance(WebhookDiscovery(), PushableDiscovery)
    assert not isinstance(StaticDiscovery({"a": 1}), PushableDiscovery)
    assert not isinstance(HostfileDiscovery(Path("x"), 1), PushableDiscovery)


# --------------------------------------------------------------------------- HostfileDiscovery


def _set_mtime(path: Path, mtime_ns: int) -> None:
    os.utime(path, ns=(mtime_ns, mtime_ns))


async def test_hostfile_rereads_only_when_the_file_changes(tmp_path: Path) -> None:
    path = tmp_path / "hosts"
    path.write_text("a:1\nb slots=2\n")
    _set_mtime(path, 1_000_000_000_000)
    discovery = HostfileDiscovery(path, default_slots=2)
    assert await discovery.find_hosts() == {"a": 1, "b": 2}

    # Same inode, size and mtime: the cached list stands, the file is not parsed again.
    path.write_text("c:1\nd slots=2\n")
    _set_mtime(path, 1_000_000_000_000)
    assert await discovery.find_hosts() == {"a": 1, "b": 2}

    _set_mtime(path, 1_000_000_000_001)
    assert await discovery.find_hosts() == {"c": 1, "d": 2}

    # A size change alone is seen.
    path.write_text("c:1\nd slots=2\ne\n")
    _set_mtime(path, 1_000_000_000_001)
    assert await discovery.find_hosts() == {"c": 1, "d": 2, "e": 2}


async def test_hostfile_replaced_by_rename_is_reread(tmp_path: Path) -> None:
    path = tmp_path / "hosts"
    path.write_text("a:1\n")
    _set_mtime(path, 5_000_000_000)
    discovery = HostfileDiscovery(path, default_slots=1)
    assert await discovery.find_hosts() == {"a": 1}
    new = tmp_path / "hosts.new"
    new.write_text("b:2\n")  # same size
    _set_mtime(new, 5_000_000_000)  # same mtime
    new.replace(path)  # new inode
    assert await discovery.find_hosts() == {"b": 2}


async def test_hostfile_parse_error_then_fixed(tmp_path: Path) -> None:
    path = tmp_path / "hosts"
    path.write_text("a:1\n")
    discovery = HostfileDiscovery(path, default_slots=1)
    assert await discovery.find_hosts() == {"a": 1}
    path.write_text("a:1\nb:zz\n")
    with pytest.raises(DiscoveryError) as info:
        await discovery.find_hosts()
    assert str(info.value) == (
        f"hostfile {path}: line 2: 'b:zz': slots must be a whole number >= 0, got 'zz'")
    path.write_text("a:1\nb:3\n")
    assert await discovery.find_hosts() == {"a": 1, "b": 3}


async def test_hostfile_deleted(tmp_path: Path) -> None:
    path = tmp_path / "hosts"
    path.write_text("a:1\n")
    discovery = HostfileDiscovery(path, default_slots=1)
    assert await discovery.find_hosts() == {"a": 1}
    path.unlink()
    with pytest.raises(DiscoveryError) as info:
        await discovery.find_hosts()
    assert str(info.value) == f"hostfile {path}: cannot read: No such file or directory"


async def test_hostfile_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "hosts"
    path.write_bytes(b"a:1\n\xff\xfe\n")
    with pytest.raises(DiscoveryError) as info:
        await HostfileDiscovery(path, default_slots=1).find_hosts()
    assert str(info.value) == f"hostfile {path}: not UTF-8 text"
