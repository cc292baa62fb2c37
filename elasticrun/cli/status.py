"""`elasticrun status URL` (or `--url URL`): a running job's /status, as a readable table."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import click

from elasticrun.job.errors import ElasticrunError


def fetch_status(url: str, timeout: float) -> dict[str, Any]:
    """GETs URL/status. Raises ElasticrunError with one line when the driver cannot answer."""
    base = url.rstrip("/")
    if not base.startswith(("http://", "https://")):
        base = "http://" + base
    if not base.endswith("/status"):
        base += "/status"
    try:
        with urllib.request.urlopen(base, timeout=timeout) as response:
            body = response.read(4 * 1024 * 1024)
    except urllib.error.HTTPError as exc:
        raise ElasticrunError(f"{base}: the driver answered HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ElasticrunError(f"{base}: cannot reach the driver: {reason}") from None
    try:
        status = json.loads(body)
    except ValueError:
        raise ElasticrunError(f"{base}: the answer is not JSON; is this an elasticrun "
                              f"driver?") from None
    if not isinstance(status, dict) or "hosts" not in status:
        raise ElasticrunError(f"{base}: the answer is not an elasticrun status")
    return status


def format_status(status: dict[str, Any]) -> str:
    lines = [
        f"job {status.get('job_id')}: {status.get('state')}, round {status.get('round')}, "
        f"world size {status.get('world_size')}, resets {status.get('resets')}"
        + (f"/{status['reset_limit']}" if status.get("reset_limit") is not None else "")
        + f", up {_duration(status.get('uptime_s'))}"
        + (f", driver epoch {status['driver_epoch']} (resumed)"
           if (status.get("driver_epoch") or 1) > 1 else ""),
    ]
    discovery = status.get("discovery") or {}
    lines.append(f"hosts from {discovery.get('source')}"
                 + (f" (last poll failed: {discovery['last_error']})"
                    if discovery.get("last_error") else ""))
    rows = [("HOST", "SLOTS", "STATE", "RANKS")]
    for host in status.get("hosts", []):
        rows.append((str(host.get("host")), str(host.get("slots")), str(host.get("state")),
                     _ranks(host.get("ranks") or [])))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True))
                     .rstrip())
    blacklist = status.get("blacklist") or []
    if blacklist:
        lines.append("blacklisted:")
        for entry in blacklist:
            lines.append(f"  {entry.get('host')}  {entry.get('failures')} failure(s), "
                         f"{_until(entry)}")
    slots = status.get("blacklisted_slots") or []
    if slots:
        lines.append("blacklisted slots:")
        for entry in slots:
            lines.append(f"  {entry.get('host')}[{entry.get('slot')}]  "
                         f"{entry.get('failures')} time(s), {_until(entry)}")
    flash = status.get("flash_commits")
    if flash:
        every = flash.get("every_steps")
        lines.append(f"flash commits: every {'step' if every == 1 else f'{every} steps'} "
                     f"(a commit {flash.get('copy_ms')} ms, step {flash.get('step_ms')} ms, "
                     f"{100 * (flash.get('cost') or 0):.2f}% of the time), "
                     f"{flash.get('commits')} written by {flash.get('workers')} worker(s)")
    pace = _pace(status.get("stragglers"))
    if pace:
        lines.append(pace)
    return "\n".join(lines)


def _pace(stragglers: Any) -> str:
    """The members' pace: the stragglers named now, else the slowest member's slowdown."""
    if not isinstance(stragglers, dict) or not stragglers.get("members"):
        return ""
    members = stragglers["members"]
    named = [m for m in members if m.get("straggler")]
    mode = f"(--stragglers {stragglers.get('mode')})"
    if named:
        return "stragglers: " + ", ".join(
            f"rank {m.get('rank')} on {m.get('host')} ({m.get('slowdown')}x its peers' pace)"
            for m in named) + f" {mode}"
    slowest = max(members, key=lambda m: m.get("slowdown") or 0)
    return (f"stragglers: none (slowest: rank {slowest.get('rank')} at "
            f"{slowest.get('slowdown')}x its peers' pace) {mode}")


def _until(entry: dict[str, Any]) -> str:
    """How long a blacklist entry lasts, from its cooldown_left_s (None: permanently)."""
    left = entry.get("cooldown_left_s")
    return "permanently" if left is None else f"for another {left:.0f}s"


def _ranks(ranks: list[int]) -> str:
    if not ranks:
        return "-"
    if ranks == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 2:
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(str(r) for r in ranks)


def _duration(seconds: Any) -> str:
    if not isinstance(seconds, (int, float)):
        return "?"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("url_arg", required=False, metavar="URL")
@click.option("--url", metavar="URL",
              help="The driver's address, in place of the argument URL.")
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON.")
@click.option("--timeout", type=float, default=5.0, show_default=True,
              help="Seconds to wait for the driver.")
def status_command(url_arg: str | None, url: str | None, as_json: bool, timeout: float) -> None:
    """Shows a running job's round, world size, hosts and blacklist.

    URL is the driver's address, http://HOST:PORT, as the job's start line gives it
    (`elasticrun status http://HOST:PORT`); --url URL is the same.
    """
    if url_arg is not None and url is not None:
        raise click.UsageError(f"the URL twice ({url_arg!r} and --url {url!r}): give it once, "
                               f"as the argument or as --url")
    target = url_arg if url_arg is not None else url
    if target is None:
        raise click.UsageError("no driver URL: give it, `elasticrun status http://HOST:PORT` "
                               "(as the job's start line says), or --url URL")
    status = fetch_status(target, timeout)
    click.echo(json.dumps(status, indent=2) if as_json else format_status(status))
