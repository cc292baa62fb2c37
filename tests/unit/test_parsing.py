"""Unit tests for elasticrun.discovery.parsing: host lists from scripts, hostfiles and -H."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from elasticrun.discovery.parsing import (
    MAX_SLOTS_PER_HOST,
    format_host,
    parse_host_entry,
    parse_host_lines,
    parse_hosts_flag,
)
from elasticrun.job.errors import DiscoveryError

SRC = "discovery script ./hosts.sh"


def parse(text: str, default_slots: int = 1) -> dict[str, int]:
    return parse_host_lines(text, default_slots, SRC)


# --------------------------------------------------------------------------- format_host


def test_format_host_plain_name_unchanged() -> None:
    assert format_host("node1") == "node1"
    assert format_host("10.0.0.1") == "10.0.0.1"


def test_format_host_brackets_ipv6() -> None:
    assert format_host("fe80::1") == "[fe80::1]"
    assert format_host("::1") == "[::1]"


# --------------------------------------------------------------------------- parse_host_entry


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ("node1", ("node1", 3)),
        ("node1:4", ("node1", 4)),
        ("node1:0", ("node1", 0)),
        ("node1:04", ("node1", 4)),
        ("node1 slots=5", ("node1", 5)),
        ("node1 max_slots=6", ("node1", 6)),
        ("10.0.0.7:2", ("10.0.0.7", 2)),
        ("host-a.example.com:8", ("host-a.example.com", 8)),
        ("my_host", ("my_host", 3)),
        ("[fe80::1]:4", ("fe80::1", 4)),
        ("[fe80::1]", ("fe80::1", 3)),
        ("fe80::1", ("fe80::1", 3)),
        ("::1", ("::1", 3)),
        ("[::1]:0", ("::1", 0)),
        # IPv6 addresses are normalised, so one host has one spelling.
        ("[FE80:0:0::0001]:2", ("fe80::1", 2)),
        ("FE80:0000::1", ("fe80::1", 3)),
        (f"node1:{MAX_SLOTS_PER_HOST}", ("node1", MAX_SLOTS_PER_HOST)),
    ],
)
def test_parse_host_entry_accepts(entry: str, expected: tuple[str, int]) -> None:
    assert parse_host_entry(entry, 3) == expected


@pytest.mark.parametrize(
    ("entry", "fragment"),
    [
        ("host:abc", "slots must be a whole number"),
        ("host:-1", "slots must be a whole number"),
        ("host:+1", "slots must be a whole number"),
        ("host:1.5", "slots must be a whole number"),
        ("host:", "slots must be a whole number"),
        ("host:\u0663", "slots must be a whole number"),  # ARABIC-INDIC DIGIT THREE
        (f"host:{MAX_SLOTS_PER_HOST + 1}", f"at most {MAX_SLOTS_PER_HOST}"),
        ("host:99999999999999999999999", f"at most {MAX_SLOTS_PER_HOST}"),
        ("a b c", "one host per entry"),
        ("host slots", "expected 'host slots=N'"),
        ("host slots=x", "slots must be a whole number"),
        ("host slots=-2", "slots must be a whole number"),
        ("$$$", "not a valid host name"),
        ("-host", "not a valid host name"),
        ("host-", "not a valid host name"),
        (":4", "empty host name"),
        ("[::1", "missing ']'"),
        ("[::1]4", "expected '[address]:slots'"),
        ("[::1]:x", "slots must be a whole number"),
        ("[zz::]:2", "not a valid IPv6 address"),
        ("[]:2", "not a valid IPv6 address"),
        ("fe80::zz", "not a valid IPv6 address"),
        ("a" * 254, "not a valid host name"),
    ],
)
def test_parse_host_entry_rejects(entry: str, fragment: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_host_entry(entry, 1)
    assert fragment in str(info.value)


def test_parse_host_entry_longest_valid_name() -> None:
    name = ".".join(["a" * 63] * 3 + ["a" * 61])  # 253 characters, labels of at most 63
    assert parse_host_entry(name, 2) == (name, 2)


def test_parse_host_entry_rejects_trailing_newline() -> None:
    with pytest.raises(ValueError):
        parse_host_entry("host\n", 1)


def test_parse_host_entry_ipv6_hostfile_style() -> None:
    assert parse_host_entry("fe80::1 slots=2", 1) == ("fe80::1", 2)


# --------------------------------------------------------------------------- parse_host_lines


def test_lines_all_forms_in_order() -> None:
    text = "node1:2\nnode2 slots=3\n[fe80::1]:4\n[fe80::2]\nfe80::3\nnode3\n"
    result = parse(text, default_slots=5)
    assert result == {
        "node1": 2,
        "node2": 3,
        "fe80::1": 4,
        "fe80::2": 5,
        "fe80::3": 5,
        "node3": 5,
    }
    assert list(result) == ["node1", "node2", "fe80::1", "fe80::2", "fe80::3", "node3"]
    assert all(type(v) is int for v in result.values())


def test_lines_blank_lines_and_comments_ignored() -> None:
    text = (
        "# full-line comment\n"
        "\n"
        "   \n"
        "\t\n"
        "node1:2   # trailing comment\n"
        "   # indented comment\n"
        "node2 slots=3#no space before comment\n"
        "[::1]:1 # ipv6 with comment\n"
        "#node3:9\n"
    )
    assert parse(text) == {"node1": 2, "node2": 3, "::1": 1}


def test_lines_windows_line_endings_and_surrounding_spaces() -> None:
    assert parse("  node1:2  \r\nnode2:1\r\n") == {"node1": 2, "node2": 1}


def test_lines_empty_text() -> None:
    assert parse("") == {}
    assert parse("\n\n# only comments\n") == {}


def test_lines_duplicates_keep_first_position_and_last_slots() -> None:
    text = "a:1\nb:2\na:5\nc:1\nb:0\n"
    result = parse(text)
    assert list(result) == ["a", "b", "c"]
    assert result == {"a": 5, "b": 0, "c": 1}


def test_lines_ipv6_duplicates_in_different_spellings_merge() -> None:
    result = parse("[fe80::1]:2\nx:1\nFE80:0::1\n", default_slots=7)
    assert list(result) == ["fe80::1", "x"]
    assert result["fe80::1"] == 7


def test_lines_zero_slots_kept() -> None:
    assert parse("a:0\nb slots=0\n[::1]:0\n") == {"a": 0, "b": 0, "::1": 0}


@pytest.mark.parametrize(
    ("text", "line_number"),
    [
        ("host:abc", 1),
        ("ok:1\nhost:-1", 2),
        ("ok:1\n\n# comment\na b c\n", 4),
        ("$$$", 1),
        ("a:1\nb:2\n[::1", 3),
        ("[zz::]:2", 1),
        (f"h:{MAX_SLOTS_PER_HOST + 1}", 1),
        ("h:99999999999999999999999999999999", 1),
        ("h:" + "9" * 5000, 1),
        ("h slots=", 1),
    ],
)
def test_lines_errors_name_source_and_line(text: str, line_number: int) -> None:
    with pytest.raises(DiscoveryError) as info:
        parse(text)
    message = str(info.value)
    assert message.startswith(f"{SRC}: line {line_number}: ")
    assert "\n" not in message and "\r" not in message


def test_lines_error_shortens_very_long_lines() -> None:
    with pytest.raises(DiscoveryError) as info:
        parse("$" * 10_000)
    message = str(info.value)
    assert len(message) < 300
    assert "..." in message


def test_lines_first_bad_line_is_reported() -> None:
    with pytest.raises(DiscoveryError, match=r"line 2: 'bad:x'"):
        parse("good:1\nbad:x\nworse:y\n")


def test_lines_huge_slot_count_message_is_about_slots() -> None:
    with pytest.raises(DiscoveryError) as info:
        parse("h:" + "9" * 5000)
    message = str(info.value)
    assert f"at most {MAX_SLOTS_PER_HOST}" in message
    assert "set_int_max_str_digits" not in message


def test_lines_errors_are_discovery_errors_not_value_errors() -> None:
    # The DiscoveryError must not also be the ValueError from the entry parser.
    with pytest.raises(DiscoveryError) as info:
        parse("host:abc")
    assert not isinstance(info.value, ValueError)
    assert info.value.__cause__ is None
    assert info.value.__suppress_context__


# --------------------------------------------------------------------------- parse_hosts_flag


def test_hosts_flag_comma_separated() -> None:
    result = parse_hosts_flag("node1:2,node2, [fe80::1]:3 ,fe80::2", 4)
    assert result == {"node1": 2, "node2": 4, "fe80::1": 3, "fe80::2": 4}
    assert list(result) == ["node1", "node2", "fe80::1", "fe80::2"]


def test_hosts_flag_skips_empty_entries() -> None:
    assert parse_hosts_flag(",a:1,,b:2,", 1) == {"a": 1, "b": 2}


def test_hosts_flag_duplicates() -> None:
    result = parse_hosts_flag("a:1,b:1,a:3", 1)
    assert list(result) == ["a", "b"]
    assert result["a"] == 3


@pytest.mark.parametrize("value", ["", ",", " , ,"])
def test_hosts_flag_empty_is_error(value: str) -> None:
    with pytest.raises(ValueError, match="no hosts given"):
        parse_hosts_flag(value, 1)


@pytest.mark.parametrize("value", ["a:zz", "a:1,b:-1", "a:1,$$$", "[::1"])
def test_hosts_flag_bad_entry_named(value: str) -> None:
    bad = value.split(",")[-1]
    with pytest.raises(ValueError) as info:
        parse_hosts_flag(value, 1)
    message = str(info.value)
    assert message.startswith(repr(bad))
    assert "\n" not in message


# --------------------------------------------------------------------------- properties

_LABEL = r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,8}[A-Za-z0-9_])?"
_HOSTNAME = st.from_regex(rf"\A{_LABEL}(\.{_LABEL}){{0,2}}\Z")
_IPV6 = st.ip_addresses(v=6).map(str)
_HOST = st.one_of(_HOSTNAME, _IPV6)
_SLOTS = st.integers(min_value=0, max_value=MAX_SLOTS_PER_HOST)


@st.composite
def _host_line(draw: st.DrawFn, host: str, slots: int | None) -> str:
    """One valid line for (host, slots); slots None means 'use the default'."""
    is_v6 = ":" in host
    if slots is None:
        return draw(st.sampled_from([host, f"[{host}]"] if is_v6 else [host]))
    forms = [f"{format_host(host)}:{slots}"]
    if not is_v6:
        forms += [f"{host} slots={slots}", f"{host}   slots={slots}"]
    line = draw(st.sampled_from(forms))
    if draw(st.booleans()):
        line = f"  {line}  # comment {slots}"
    return line


@st.composite
def _host_lists(draw: st.DrawFn) -> tuple[list[tuple[str, int | None]], list[str]]:
    pool = draw(st.lists(_HOST, min_size=1, max_size=6, unique=True))
    entries = draw(
        st.lists(
            st.tuples(st.sampled_from(pool), st.one_of(st.none(), _SLOTS)),
            max_size=15,
        )
    )
    lines = [draw(_host_line(host, slots)) for host, slots in entries]
    # Sprinkle blank and comment lines between the entries.
    out: list[str] = []
    for line in lines:
        if draw(st.booleans()):
            out.append(draw(st.sampled_from(["", "   ", "# a comment", "  #x:1"])))
        out.append(line)
    return entries, out


@given(data=_host_lists(), default_slots=st.integers(min_value=1, max_value=64))
@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
def test_property_format_then_parse_round_trips(
    data: tuple[list[tuple[str, int | None]], list[str]], default_slots: int
) -> None:
    entries, lines = data
    expected: dict[str, int] = {}
    for host, slots in entries:
        key = str(ipaddress.IPv6Address(host)) if ":" in host else host
        expected[key] = default_slots if slots is None else slots
    result = parse_host_lines("\n".join(lines), default_slots, SRC)
    assert result == expected
    assert list(result) == list(expected)  # order of first appearance
    # The same entries through -H, comma separated.
    if entries:
        flag = ",".join(
            format_host(host) if slots is None else f"{format_host(host)}:{slots}"
            for host, slots in entries
        )
        flag_result = parse_hosts_flag(flag, default_slots)
        assert flag_result == expected
        assert list(flag_result) == list(expected)


@given(text=st.text())
@settings(max_examples=500)
def test_property_arbitrary_text_parses_or_raises_discovery_error(text: str) -> None:
    try:
        result = parse_host_lines(text, 2, SRC)
    except DiscoveryError as exc:
        message = str(exc)
        assert message.startswith(f"{SRC}: line ")
        assert "\n" not in message and "\r" not in message
        return
    assert isinstance(result, dict)
    for host, slots in result.items():
        assert isinstance(host, str) and host
        assert type(slots) is int
        assert 0 <= slots <= MAX_SLOTS_PER_HOST


_NEARLY_VALID = st.lists(
    st.one_of(
        st.text(alphabet="ab1:[]# .=-_slotmax\t%\n", max_size=20),
        _HOST,
        st.builds(lambda h, s: f"{format_host(h)}:{s}", _HOST, st.integers(-5, 10_000)),
    ),
    max_size=8,
).map("\n".join)


@given(text=_NEARLY_VALID)
@settings(max_examples=300)
def test_property_nearly_valid_text_parses_or_raises_discovery_error(text: str) -> None:
    try:
        result = parse_host_lines(text, 1, SRC)
    except DiscoveryError as exc:
        assert "\n" not in str(exc)
        return
    for host, slots in result.items():
        assert "\n" not in host and "#" not in host and " " not in host
        assert 0 <= slots <= MAX_SLOTS_PER_HOST
