"""torchrun's --log-dir, --redirects, --tee and --local-ranks-filter through a real
OutputRouter: what reaches the console, and what is kept in torchrun's layout,
LOG_DIR/<run id>_<random>/[<node>/]attempt_<K>/<local rank>/stdout.log|stderr.log."""

from __future__ import annotations

import asyncio
import io
import re
from pathlib import Path

import pytest

from elasticrun.cli.torchrun_args import parse_std
from elasticrun.driver.processes.output import OutputRouter, WorkerLogs
from elasticrun.job.config import TorchrunSettings

OUT, ERR = ("stdout",), ("stderr",)
BOTH = ("stdout", "stderr")


def settings(log_dir: Path | None, redirects: str = "", tee: str = "",
             ranks: frozenset[int] | None = None) -> TorchrunSettings:
    """Two nodes of two workers (nodes_of)."""
    return TorchrunSettings(log_dir=log_dir, redirects=parse_std("-r", redirects or "0"),
                            tee=parse_std("-t", tee or "0"), local_ranks_filter=ranks,
                            nodes_of=2)


def run_workers(router: OutputRouter, local_ranks: dict[int, int], attempt: int = 0) -> None:
    """Each rank (its local rank given; ranks 0-1 on node n0, 2-3 on n1) prints `out-R` and
    `err-R`."""
    async def main() -> None:
        pumps = []
        for rank, local_rank in local_ranks.items():
            for stream in ("stdout", "stderr"):
                reader = asyncio.StreamReader()
                reader.feed_data(f"{stream[3:]}-{rank}\n".encode())
                reader.feed_eof()
                pumps.append(router.pump(reader, stream, lambda r=rank: r,
                                         local_rank=local_rank,
                                         place=(f"n{rank // 2}", attempt)))
        await asyncio.gather(*pumps)

    asyncio.run(main())


def routed(tmp_path: Path, logs: WorkerLogs | None, run_id: str = "run1"
           ) -> tuple[set[str], set[str], dict[str, str]]:
    """(console stdout lines, console stderr lines, {relative file path: its text})."""
    out, err = io.BytesIO(), io.BytesIO()
    router = OutputRouter(out, err, None, False, logs)
    router.name_run(run_id)
    run_workers(router, {0: 0, 1: 1, 2: 0, 3: 1})  # two nodes of two local ranks
    router.close()
    # the run's directory is <run id>_<random>: named here <run id>
    files = {re.sub(rf"^{re.escape(run_id)}_[^/]+/", f"{run_id}/", str(p.relative_to(tmp_path))):
             p.read_text() for p in sorted(tmp_path.rglob("*")) if p.is_file()}
    return set(out.getvalue().decode().split()), set(err.getvalue().decode().split()), files


ALL_OUT = {"[0]<stdout>:out-0", "[1]<stdout>:out-1", "[2]<stdout>:out-2", "[3]<stdout>:out-3"}
ALL_ERR = {"[0]<stderr>:err-0", "[1]<stderr>:err-1", "[2]<stderr>:err-2", "[3]<stderr>:err-3"}


def test_torchruns_default_is_the_console_only(tmp_path: Path) -> None:
    assert WorkerLogs.of(settings(tmp_path)) is None
    assert routed(tmp_path, None) == (ALL_OUT, ALL_ERR, {})


def test_redirect_everything(tmp_path: Path) -> None:
    out, err, files = routed(tmp_path, WorkerLogs.of(settings(tmp_path, redirects="3")))
    assert out == set() and err == set()
    assert files == {f"run1/n{r // 2}/attempt_0/{r % 2}/{s}.log": f"{s[3:]}-{r}\n"
                     for r in range(4) for s in ("stdout", "stderr")}


def test_redirect_one_stream_of_one_local_rank(tmp_path: Path) -> None:
    out, err, files = routed(tmp_path, WorkerLogs.of(settings(tmp_path, redirects="0:1")))
    assert out == {"[1]<stdout>:out-1", "[3]<stdout>:out-3"} and err == ALL_ERR
    assert files == {"run1/n0/attempt_0/0/stdout.log": "out-0\n",
                     "run1/n1/attempt_0/0/stdout.log": "out-2\n"}


def test_tee_keeps_and_shows(tmp_path: Path) -> None:
    out, err, files = routed(tmp_path, WorkerLogs.of(settings(tmp_path, tee="2")))
    assert out == ALL_OUT and err == ALL_ERR
    assert files == {f"run1/n{r // 2}/attempt_0/{r % 2}/stderr.log": f"err-{r}\n"
                     for r in range(4)}


def test_tee_wins_over_redirect(tmp_path: Path) -> None:
    logs = WorkerLogs.of(settings(tmp_path, redirects="3", tee="1:1"))
    out, err, files = routed(tmp_path, logs)
    assert out == {"[1]<stdout>:out-1", "[3]<stdout>:out-3"} and err == set()
    assert len(files) == 8


def test_local_ranks_filter_limits_the_console_only(tmp_path: Path) -> None:
    logs = WorkerLogs.of(settings(tmp_path, tee="3", ranks=frozenset({0})))
    out, err, files = routed(tmp_path, logs)
    assert out == {"[0]<stdout>:out-0", "[2]<stdout>:out-2"}
    assert err == {"[0]<stderr>:err-0", "[2]<stderr>:err-2"}
    assert len(files) == 8  # files keep every rank


def test_filter_without_a_log_dir(tmp_path: Path) -> None:
    out, err, files = routed(tmp_path, WorkerLogs.of(settings(None, ranks=frozenset({1}))))
    assert out == {"[1]<stdout>:out-1", "[3]<stdout>:out-3"} and files == {}


def test_output_filename_and_log_dir_together(tmp_path: Path) -> None:
    out = io.BytesIO()
    router = OutputRouter(out, io.BytesIO(), tmp_path / "all", False,
                          WorkerLogs.of(settings(tmp_path / "logs", redirects="1")))
    router.name_run("r/../x")  # a run id is a name, never a path
    run_workers(router, {0: 0})
    router.close()
    assert (tmp_path / "all/rank.0/stdout").read_text() == "out-0\n"
    assert (tmp_path / "all/rank.0/stderr").read_text() == "err-0\n"
    [run] = (tmp_path / "logs").iterdir()
    assert run.name.startswith("r_.._x_")
    assert (run / "n0/attempt_0/0/stdout.log").read_text() == "out-0\n"
    assert out.getvalue() == b""


def test_one_node_is_torchruns_layout_each_attempt_its_own(tmp_path: Path) -> None:
    """One node: `<run id>_<random>/attempt_<K>/<local rank>/`, as torchrun's own files; a
    restart (attempt 1) writes beside the first attempt, never over it."""
    one_node = TorchrunSettings(log_dir=tmp_path, redirects=parse_std("-r", "1"),
                                line_prefix="[${role_name}${local_rank}]:")
    router = OutputRouter(io.BytesIO(), io.BytesIO(), None, False, WorkerLogs.of(one_node))
    router.name_run("job")
    run_workers(router, {0: 0, 1: 1})
    run_workers(router, {0: 0, 1: 1}, attempt=1)
    router.close()
    [run] = tmp_path.iterdir()
    assert run.name.startswith("job_") and run == router.run_dir
    assert sorted(str(p.relative_to(run)) for p in run.rglob("*.log")) == [
        "attempt_0/0/stdout.log", "attempt_0/1/stdout.log", "attempt_1/0/stdout.log",
        "attempt_1/1/stdout.log"]


@pytest.mark.parametrize(("local_rank", "stream", "kept", "shown"), [
    (0, "stdout", True, False), (0, "stderr", False, True),
    (1, "stdout", True, True), (1, "stderr", True, True), (2, "stdout", False, False)])
def test_policy_table(local_rank: int, stream: str, kept: bool, shown: bool) -> None:
    logs = WorkerLogs(Path("/l"), redirects=((0, OUT),), tee=((1, BOTH),),
                      local_ranks_filter=frozenset({0, 1}))
    assert logs.kept(local_rank, stream) is kept
    assert logs.shown(local_rank, stream) is shown


# --- torchrun's form: its console as torchrun writes it ---------------------------------------
def torchrun_settings(log_dir: Path | None, tee: str = "0", redirects: str = "0",
                      prefix: str = "[${role_name}${local_rank}]:") -> TorchrunSettings:
    return TorchrunSettings(log_dir=log_dir, redirects=parse_std("-r", redirects),
                            tee=parse_std("-t", tee), role="trainer", line_prefix=prefix)


def test_torchruns_console_is_the_workers_own_lines(tmp_path: Path) -> None:
    """Neither teed nor redirected: no prefix, as torchrun's workers write to its console."""
    out, err, files = routed(tmp_path, WorkerLogs.of(torchrun_settings(None)))
    assert out == {"out-0", "out-1", "out-2", "out-3"} and files == {}
    assert err == {"err-0", "err-1", "err-2", "err-3"}


def test_a_teed_line_has_torchruns_prefix(tmp_path: Path) -> None:
    out, err, _ = routed(tmp_path, WorkerLogs.of(torchrun_settings(tmp_path, tee="1")))
    assert out == {"[trainer0]:out-0", "[trainer1]:out-1", "[trainer0]:out-2",
                   "[trainer1]:out-3"}
    assert err == {"err-0", "err-1", "err-2", "err-3"}  # not teed: as written


def test_the_prefix_template(tmp_path: Path) -> None:
    """TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE: ${rank}, ${local_rank}, ${role_name}; any other
    placeholder is left as it is (string.Template's safe_substitute, as torchrun)."""
    settings = torchrun_settings(tmp_path, tee="3", redirects="3",
                                 prefix="<${role_name}|${rank}|${local_rank}|${x}>")
    out, _, _ = routed(tmp_path, WorkerLogs.of(settings))
    assert out == {"<trainer|0|0|${x}>out-0", "<trainer|1|1|${x}>out-1",
                   "<trainer|2|0|${x}>out-2", "<trainer|3|1|${x}>out-3"}
