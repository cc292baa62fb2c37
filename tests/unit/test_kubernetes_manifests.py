"""examples/kubernetes, checked without a cluster: every document parses; every container
command whose program is elasticrun parses with elasticrun's own command line (after
Kubernetes' $(VAR) substitution, and a real `sh -c` where the command goes through one), the
driver's on through build_config and build_parts; the names the pieces share agree: the
Service, ports, the Secret and its mount, probes, labels and selectors, replica counts, grace
periods; and the driver restarts in place: --resume exactly when its journal exists, its
--state-dir on a volume of its own pod."""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import click
import pytest
import yaml

from elasticrun.agent.runner import AgentSettings
from elasticrun.api.job_config import build_config, build_parts
from elasticrun.cli import cli
from elasticrun.cli.agent import agent_command, agent_settings
from elasticrun.driver.journal.files import NAME as JOURNAL
from elasticrun.job.config import DriverConfig
from elasticrun.job.errors import ConfigError
from elasticrun.job.tokens import MIN_TOKEN_LENGTH

HERE = Path(__file__).resolve().parents[2] / "examples" / "kubernetes"
Doc = dict[str, Any]

WORKLOAD_KINDS = ("Job", "StatefulSet", "Deployment", "DaemonSet", "ReplicaSet")
# Kubernetes' expansion in command/args: $(VAR) from the container's env, $$ for a literal $.
VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
# What the downward API gives for the fields a manifest may ask (a pod of the workload).
FIELD_VALUES = {"metadata.namespace": "default", "status.podIP": "10.0.0.7",
                "spec.nodeName": "node-1", "status.hostIP": "10.0.0.1"}
# Options of the driver's CLI that cli() handles itself instead of passing to build_config.
CLI_ONLY = ("verbose", "log_level", "timeline_filename", "timeline_mark_cycles")
SHELLS = ("sh", "bash", "dash")
# The kubelet restarts a crashed container after 10 s, doubling with each crash, at most 300 s.
RESTART_BACKOFF_S, RESTART_BACKOFF_MAX_S = 10.0, 300.0


# --- the documents -------------------------------------------------------------------------
@functools.cache
def files() -> dict[str, tuple[Doc, ...]]:
    loaded = {}
    for path in sorted([*HERE.glob("*.yaml"), *HERE.glob("*.yml")]):
        loaded[path.name] = tuple(d for d in yaml.safe_load_all(path.read_text())
                                  if d is not None)
    return loaded


def documents() -> list[tuple[str, Doc]]:
    return [(name, doc) for name, docs in files().items() for doc in docs]


def find(kind: str, name: str | None = None, file: str | None = None) -> Doc:
    found = [doc for where, doc in documents() if doc.get("kind") == kind
             and (name is None or doc["metadata"]["name"] == name)
             and (file is None or where == file)]
    what = f"{kind} {name!r}" if name else kind
    assert len(found) == 1, (f"expected one {what}{f' in {file}' if file else ''} under "
                             f"{HERE}, found {len(found)}")
    return found[0]


@dataclass(frozen=True)
class Box:
    """One container of a workload's pod template, with what Kubernetes would run."""

    file: str
    workload: Doc
    container: Doc

    @property
    def where(self) -> str:
        meta = self.workload["metadata"]
        return f"{self.file}: {self.workload['kind']}/{meta['name']} " \
               f"container {self.container.get('name')!r}"

    @property
    def pod(self) -> Doc:
        spec: Doc = self.workload["spec"]["template"]["spec"]
        return spec

    @property
    def labels(self) -> dict[str, str]:
        labels: dict[str, str] = self.workload["spec"]["template"]["metadata"]["labels"]
        return labels

    @property
    def pod_name(self) -> str:
        """A name the pod would get: a StatefulSet's are NAME-ORDINAL."""
        name = self.workload["metadata"]["name"]
        return f"{name}-0" if self.workload["kind"] == "StatefulSet" else f"{name}-x7k2p"

    def env(self) -> dict[str, str]:
        values: dict[str, str] = {}
        for entry in self.container.get("env", []):
            name = entry["name"]
            if "value" in entry:
                values[name] = str(entry["value"])
                continue
            field = entry.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
            if field == "metadata.name":
                values[name] = self.pod_name
            else:  # another field, a Secret's or a ConfigMap's key: a stand-in
                values[name] = FIELD_VALUES.get(str(field), f"{name.lower()}-value")
        return values

    def argv(self) -> list[str]:
        """command + args with $(VAR) substituted as Kubernetes does; a $(VAR) missing from
        the env would be passed on literally, so it fails here."""
        words = [*self.container.get("command", []), *self.container.get("args", [])]
        bad = [w for w in words if not isinstance(w, str)]
        assert not bad, f"{self.where}: command/args {bad!r} are not strings (Kubernetes " \
                        f"refuses them: quote them in the YAML)"
        env = self.env()
        used = {m.group(1) for w in words for m in VAR.finditer(w) if m.group(1)}
        missing = sorted(used - env.keys())
        assert not missing, f"{self.where}: $({', $('.join(missing)}) used in command/args " \
                            f"but not defined in the container's env {sorted(env)}"
        return [VAR.sub(lambda m: "$" if m.group(0) == "$$" else env[m.group(1)], w)
                for w in words]

    def elasticrun_args(self, expand: bool = True, journal: bool = False) -> list[str] | None:
        """What follows the program when it is `elasticrun` or `python -m elasticrun`
        (expand=False: with $(VAR) as written), also when `sh -c` runs it (journal: with
        a journal in the command's --state-dir, as after a restart)."""
        words = self.argv() if expand else \
            [str(w) for w in [*self.container.get("command", []),
                              *self.container.get("args", [])]]
        if len(words) >= 3 and PurePosixPath(words[0]).name in SHELLS and words[1] == "-c":
            words = list(through_shell(tuple(words), journal))
        if words and PurePosixPath(words[0]).name == "elasticrun":
            return words[1:]
        if len(words) >= 3 and PurePosixPath(words[0]).name.startswith("python") \
                and words[1:3] == ["-m", "elasticrun"]:
            return words[3:]
        return None

    def role(self) -> str | None:
        args = self.elasticrun_args()
        if args is None:
            return None
        return args[0] if args[:1] in (["agent"], ["status"]) else "driver"

    def port(self, ref: int | str) -> int:
        """A container port, by number or by name."""
        ports = self.container.get("ports", [])
        if isinstance(ref, int):
            assert any(p["containerPort"] == ref for p in ports), \
                f"{self.where}: port {ref} is not among its containerPorts {ports}"
            return ref
        named = [p["containerPort"] for p in ports if p.get("name") == ref]
        assert named, f"{self.where}: no containerPort named {ref!r} (it has {ports})"
        port: int = named[0]
        return port


def state_dir_of(words: tuple[str, ...]) -> str | None:
    for i, word in enumerate(words):
        if word == "--state-dir" and i + 1 < len(words):
            return words[i + 1]
        if word.startswith("--state-dir="):
            return word.split("=", 1)[1]
    return None


@functools.cache
def through_shell(words: tuple[str, ...], journal: bool) -> tuple[str, ...]:
    """What `sh -c SCRIPT NAME ARGS...` runs, by a real shell: the programs it may exec are
    stubs that print their arguments; the command's --state-dir is moved to a temporary
    directory (holding a journal or not), and back in what comes out."""
    state = state_dir_of(words)
    with tempfile.TemporaryDirectory() as tmp:
        stubs, moved = Path(tmp, "bin"), Path(tmp, "state")
        stubs.mkdir()
        moved.mkdir()
        if journal:
            (moved / JOURNAL).write_text("{}")
        for name in ("elasticrun", "python", "python3"):
            (stubs / name).write_text(f"#!{sys.executable}\n"
                                      "import json, sys\nprint(json.dumps(sys.argv))\n")
            (stubs / name).chmod(0o755)
        run = [w.replace(state, str(moved)) for w in words] if state else list(words)
        done = subprocess.run(run, env={"PATH": f"{stubs}:/usr/bin:/bin"}, text=True,
                              capture_output=True, timeout=30, check=False)
    assert done.returncode == 0, f"{list(words)} failed ({done.returncode}): {done.stderr}"
    argv = json.loads(done.stdout)
    argv[0] = PurePosixPath(argv[0]).name
    return tuple(a.replace(str(moved), state) for a in argv) if state else tuple(argv)


def boxes() -> list[Box]:
    found = []
    for file, doc in documents():
        if doc.get("kind") not in WORKLOAD_KINDS:
            continue
        spec = doc["spec"]["template"]["spec"]
        for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
            found.append(Box(file, doc, container))
    return found


def with_role(role: str) -> list[Box]:
    return [box for box in boxes() if box.role() == role]


def the_driver() -> Box:
    found = with_role("driver")
    assert len(found) == 1, f"expected one container running the elasticrun driver, found " \
                            f"{[b.where for b in found]}"
    return found[0]


def the_agents() -> Box:
    found = with_role("agent")
    assert len(found) == 1, f"expected one container running `elasticrun agent`, found " \
                            f"{[b.where for b in found]}"
    return found[0]


def flag(box: Box, name: str, expand: bool = True) -> str:
    """The value of --name in the container's elasticrun command (--name V or --name=V)."""
    args = box.elasticrun_args(expand) or []
    for i, word in enumerate(args):
        if word == "--":
            break
        if word == name and i + 1 < len(args):
            return args[i + 1]
        if word.startswith(name + "="):
            return word.split("=", 1)[1]
    raise AssertionError(f"{box.where}: {name} is not given in {args}")


# --- the Secret and its mounts -------------------------------------------------------------
def secret_data(secret: Doc) -> dict[str, str]:
    data = {key: base64.b64decode(value).decode() for key, value
            in (secret.get("data") or {}).items()}
    data.update({key: str(value) for key, value in (secret.get("stringData") or {}).items()})
    return data


def secret_file(box: Box, path: str) -> tuple[Doc, str]:
    """The Secret and the key that `path` is in this container (through a volume mount)."""
    file = PurePosixPath(path)
    mounts = [m for m in box.container.get("volumeMounts", [])
              if file.is_relative_to(m["mountPath"]) and file != PurePosixPath(m["mountPath"])]
    assert mounts, f"{box.where}: {path} is under none of its volumeMounts " \
                   f"{[m['mountPath'] for m in box.container.get('volumeMounts', [])]}"
    mount = max(mounts, key=lambda m: len(m["mountPath"]))
    assert mount.get("readOnly") is True, f"{box.where}: the mount at {mount['mountPath']} " \
                                          f"is not readOnly"
    volumes = [v for v in box.pod.get("volumes", []) if v["name"] == mount["name"]]
    assert volumes, f"{box.where}: the volumeMount {mount['name']!r} has no volume of that name"
    source = volumes[0].get("secret")
    assert source, f"{box.where}: volume {mount['name']!r} at {mount['mountPath']} is not a " \
                   f"Secret: {volumes[0]}"
    secret = find("Secret", source["secretName"], file="token-secret.yaml")
    relative = str(file.relative_to(mount["mountPath"]))
    items = {item["path"]: item["key"] for item in source.get("items", [])}
    key = items.get(relative, relative) if items else relative
    assert key in secret_data(secret), \
        f"{box.where}: {path} is key {key!r} of Secret {source['secretName']!r}, which has " \
        f"only {sorted(secret_data(secret))}"
    return secret, key


def materialize(box: Box, words: list[str], token_flag: str, tmp: Path) -> list[str]:
    """words with the token file's path moved to a file holding the Secret's value, as the
    Secret's mount would hold it."""
    path = flag(box, token_flag)
    secret, key = secret_file(box, path)
    local = tmp / key
    local.write_text(secret_data(secret)[key])
    return [str(local) if w == path else
            f"{token_flag}={local}" if w == f"{token_flag}={path}" else w for w in words]


@pytest.fixture
def pod_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """Nothing of this machine's ELASTICRUN_* environment leaks into the parse."""
    for name in list(os.environ):
        if name.startswith("ELASTICRUN_"):
            monkeypatch.delenv(name)
    return monkeypatch


@contextlib.contextmanager
def refused_says_where(box: Box, args: list[str]) -> Iterator[None]:
    """elasticrun's own refusal (click's or its config's), as a failure naming the container."""
    try:
        yield
    except click.ClickException as exc:
        pytest.fail(f"{box.where}: elasticrun refuses {args}: {exc.format_message()}")
    except ConfigError as exc:
        pytest.fail(f"{box.where}: elasticrun refuses {args}: {exc}")


def parse_driver(box: Box, tmp: Path, env: pytest.MonkeyPatch,
                 journal: bool = False) -> tuple[Doc, DriverConfig]:
    for name, value in box.env().items():
        env.setenv(name, value)
    args = materialize(box, box.elasticrun_args(journal=journal) or [], "--agent-token-file",
                       tmp)
    with refused_says_where(box, args):
        context = cli.make_context("elasticrun", list(args), resilient_parsing=False)
        options = dict(context.params)
        config = build_config(**{k: v for k, v in options.items() if k not in CLI_ONLY})
        build_parts(config)  # the driver's last checks (e.g. agents need a fixed --port)
    return options, config


def parse_agent(box: Box, tmp: Path, env: pytest.MonkeyPatch) -> tuple[Doc, AgentSettings]:
    for name, value in box.env().items():
        env.setenv(name, value)
    args = materialize(box, (box.elasticrun_args() or [])[1:], "--token-file", tmp)
    with refused_says_where(box, args):
        options = agent_command.make_context("elasticrun agent", list(args)).params
        settings = agent_settings(**options)  # what agent_command checks before it runs
    return options, settings


# --- the tests -----------------------------------------------------------------------------
@pytest.mark.parametrize("file", sorted(files()))
def test_every_document_parses_and_is_named(file: str) -> None:
    docs = files()[file]
    assert docs, f"{file}: no YAML document"
    for i, doc in enumerate(docs):
        assert isinstance(doc, dict), f"{file}: document {i} is a {type(doc).__name__}"
        missing = [k for k in ("apiVersion", "kind") if not doc.get(k)]
        if not (doc.get("metadata") or {}).get("name"):
            missing.append("metadata.name")
        assert not missing, f"{file}: document {i} ({doc.get('kind')}) lacks {missing}"


def test_the_example_has_its_pieces() -> None:
    assert set(files()) >= {"token-secret.yaml", "driver.yaml", "agents.yaml"}, sorted(files())
    kinds = sorted(doc["kind"] for _, doc in documents())
    for kind in ("Secret", "Job", "Service", "StatefulSet"):
        assert kind in kinds, f"no {kind} among {kinds}"


@pytest.mark.parametrize("box", boxes(), ids=lambda b: b.where)
def test_every_command_is_strings_and_every_var_is_defined(box: Box) -> None:
    box.argv()


def test_the_driver_parses_with_elasticruns_cli(tmp_path: Path,
                                                pod_env: pytest.MonkeyPatch) -> None:
    box = the_driver()
    options, config = parse_driver(box, tmp_path, pod_env)
    want = {"launcher": "agent", "port": 29400, "min_np": 2, "max_np": 8,
            "start_timeout": 300.0, "blacklist_cooldown_range": (10.0, 300.0),
            "command": ("python", "/app/train.py")}
    got = {key: options[key] for key in want}
    assert got == want, f"{box.where}: the parsed options {got} are not {want}"
    assert config.uses_agents and config.discovery == "agents", \
        f"{box.where}: --launcher agent should imply --discovery agents: {config.discovery}"
    assert config.bind == ("0.0.0.0",), \
        f"{box.where}: with agents the driver should listen on all interfaces: {config.bind}"
    secret, key = secret_file(box, flag(box, "--agent-token-file"))
    assert config.agent_token == secret_data(secret)[key].strip(), \
        f"{box.where}: the driver read another token than the Secret's"


def test_the_agent_parses_with_elasticruns_cli(tmp_path: Path,
                                               pod_env: pytest.MonkeyPatch) -> None:
    box = the_agents()
    options, settings = parse_agent(box, tmp_path, pod_env)
    assert settings.host == box.pod_name, \
        f"{box.where}: --host is {settings.host!r}, not the pod's name {box.pod_name!r} " \
        f"(POD_NAME from the downward API's metadata.name)"
    assert settings.slots >= 1 and settings.ready_file is not None, options
    assert settings.driver_grace > 0


@pytest.mark.parametrize("role", ["driver", "agent", "status"])
def test_every_elasticrun_container_parses(role: str, tmp_path: Path,
                                           pod_env: pytest.MonkeyPatch) -> None:
    """Any container running elasticrun (init containers, python -m elasticrun) parses."""
    for box in with_role(role):
        if role == "driver":
            parse_driver(box, tmp_path, pod_env)
        elif role == "agent":
            parse_agent(box, tmp_path, pod_env)
        else:
            from elasticrun.cli.status import status_command

            args = (box.elasticrun_args() or [])[1:]
            with refused_says_where(box, args):
                status_command.make_context("elasticrun status", list(args))


def test_the_helpers_see_what_kubernetes_would_run() -> None:
    """`python -m elasticrun` counts as elasticrun; $(VAR) comes from the env, $$ is a $."""
    workload = {"kind": "StatefulSet", "metadata": {"name": "w"}}
    box = Box("x.yaml", workload, {
        "name": "c", "command": ["/usr/bin/python3", "-m", "elasticrun"],
        "args": ["agent", "--host=$(POD)", "--x=$$(POD)"],
        "env": [{"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]})
    assert box.elasticrun_args() == ["agent", "--host=w-0", "--x=$(POD)"]
    assert box.role() == "agent"
    assert Box("x.yaml", workload, {"name": "c", "command": ["python", "train.py"]}).role() \
        is None


def test_the_driver_is_one_job_whose_container_restarts_in_place() -> None:
    box = the_driver()
    spec = box.workload["spec"]
    assert box.workload["kind"] == "Job", f"{box.where}: the driver should be a Job"
    assert box.pod.get("restartPolicy") == "OnFailure", \
        f"{box.where}: restartPolicy is {box.pod.get('restartPolicy')!r}, not OnFailure " \
        f"(a killed driver's container should restart in place, in the same pod)"
    assert spec.get("backoffLimit", 6) >= 1, \
        f"{box.where}: backoffLimit {spec.get('backoffLimit')} allows no restart"
    assert spec.get("parallelism", 1) == 1 and spec.get("completions", 1) == 1, \
        f"{box.where}: one driver at a time, please: {spec}"


def test_the_driver_resumes_exactly_when_its_journal_exists(
        tmp_path: Path, pod_env: pytest.MonkeyPatch) -> None:
    box = the_driver()
    first, again = box.elasticrun_args(), box.elasticrun_args(journal=True)
    assert first is not None and again is not None
    assert "--resume" not in first, f"{box.where}: a first start (no journal) runs {first}"
    assert [w for w in again if w != "--resume"] == first and "--resume" in again, \
        f"{box.where}: a restart (a journal in --state-dir) runs {again}, not the same " \
        f"command line plus --resume"
    options, config = parse_driver(box, tmp_path, pod_env, journal=True)
    assert config.resume and config.state_dir == Path(flag(box, "--state-dir")), options


def test_the_journal_is_on_a_volume_of_the_drivers_pod_alone() -> None:
    box = the_driver()
    state = PurePosixPath(flag(box, "--state-dir"))
    mounts = [m for m in box.container.get("volumeMounts", [])
              if state.is_relative_to(m["mountPath"])]
    assert mounts, f"{box.where}: --state-dir {state} is under none of its volumeMounts: " \
                   f"the journal would go with the container"
    mount = max(mounts, key=lambda m: len(m["mountPath"]))
    assert not mount.get("readOnly"), f"{box.where}: {mount['mountPath']} is readOnly"
    volume = next(v for v in box.pod.get("volumes", []) if v["name"] == mount["name"])
    assert {"emptyDir", "persistentVolumeClaim"} & volume.keys(), \
        f"{box.where}: the journal's volume {volume} is no emptyDir or PersistentVolumeClaim"
    claim = volume.get("persistentVolumeClaim", {}).get("claimName")
    others = [other.where for other in boxes() if other.workload is not box.workload
              and any(v.get("persistentVolumeClaim", {}).get("claimName") == claim
                      for v in other.pod.get("volumes", []))]
    assert claim is None or not others, \
        f"{box.where}: the journal holds the job's secret, but {others} mount its claim too"


def test_the_grace_periods_outlast_a_driver_restart(tmp_path: Path,
                                                   pod_env: pytest.MonkeyPatch) -> None:
    """The workers (the driver's --driver-grace) and their agents (theirs) wait for the
    driver longer than the kubelet waits to restart it, even at the last restart allowed."""
    driver, agents = the_driver(), the_agents()
    _, config = parse_driver(driver, tmp_path, pod_env)
    _, settings = parse_agent(agents, tmp_path, pod_env)
    restarts = driver.workload["spec"].get("backoffLimit", 6)
    backoff = min(RESTART_BACKOFF_S * 2 ** (restarts - 1), RESTART_BACKOFF_MAX_S)
    for who, grace in ((driver.where, config.driver_timeout),
                       (agents.where, settings.driver_grace)):
        assert grace > backoff, f"{who}: --driver-grace {grace:g} s does not outlast the " \
                                f"kubelet's back-off ({backoff:g} s) before restart {restarts}"


def test_the_agents_dial_the_drivers_service_and_port() -> None:
    agents, driver = the_agents(), the_driver()
    url = flag(agents, "--driver")
    match = re.fullmatch(r"http://([A-Za-z0-9.-]+):(\d+)/?", url)
    assert match, f"{agents.where}: --driver {url!r} is not http://SERVICE:PORT"
    name, port = match.group(1).split(".")[0], int(match.group(2))
    service = find("Service", name)
    assert service["spec"].get("type", "ClusterIP") == "ClusterIP" \
        and service["spec"].get("clusterIP") != "None", \
        f"Service {name!r}: should be a ClusterIP Service with an address"
    ports = [p for p in service["spec"]["ports"] if p["port"] == port]
    assert ports, f"--driver {url} dials port {port}; Service {name!r} exposes " \
                  f"{[p['port'] for p in service['spec']['ports']]}"
    target = driver.port(ports[0].get("targetPort", port))
    assert target == int(flag(driver, "--port")), \
        f"Service {name!r} port {port} targets container port {target}; the driver's " \
        f"--port is {flag(driver, '--port')}"
    selector = service["spec"]["selector"]
    assert selector.items() <= driver.labels.items(), \
        f"Service {name!r} selects {selector}; the driver's pods are labelled {driver.labels}"


@pytest.mark.parametrize(("role", "token_flag"), [("driver", "--agent-token-file"),
                                                  ("agent", "--token-file")])
def test_the_token_file_is_a_key_of_the_mounted_secret(role: str, token_flag: str) -> None:
    box = the_driver() if role == "driver" else the_agents()
    secret_file(box, flag(box, token_flag))  # asserts with a message


def test_the_token_is_a_long_enough_placeholder() -> None:
    token = secret_data(find("Secret", "elasticrun-agent-token"))["token"]
    assert len(token.strip()) >= MIN_TOKEN_LENGTH, \
        f"the Secret's token is {len(token.strip())} characters; elasticrun wants " \
        f"{MIN_TOKEN_LENGTH} or more"
    assert "REPLACE" in token, f"the example's token {token!r} should be marked as a " \
                               f"placeholder to replace"
    assert "openssl rand -hex 32" in (HERE / "token-secret.yaml").read_text(), \
        "token-secret.yaml should say how to make a token"


def test_the_probes_match_the_flags() -> None:
    agents, driver = the_agents(), the_driver()
    ready = flag(agents, "--ready-file")
    probe = agents.container.get("readinessProbe", {}).get("exec", {}).get("command", [])
    assert ready in probe, f"{agents.where}: readiness probe {probe} does not look at " \
                           f"--ready-file {ready}"
    http = driver.container.get("readinessProbe", {}).get("httpGet", {})
    assert http.get("path") == "/status", f"{driver.where}: readiness probe {http} is not " \
                                          f"GET /status"
    assert driver.port(http.get("port", 0)) == int(flag(driver, "--port")), \
        f"{driver.where}: readiness probe port {http.get('port')!r} is not --port " \
        f"{flag(driver, '--port')}"


def test_labels_selectors_and_names_agree() -> None:
    agents = the_agents()
    workload = agents.workload
    assert workload["kind"] == "StatefulSet", f"{agents.where}: expected a StatefulSet"
    selector = workload["spec"]["selector"]["matchLabels"]
    assert selector.items() <= agents.labels.items(), \
        f"{agents.where}: selector {selector} does not match its pods' labels {agents.labels}"
    assert workload["spec"].get("podManagementPolicy") == "Parallel", \
        f"{agents.where}: podManagementPolicy is not Parallel"
    headless = find("Service", workload["spec"].get("serviceName"))
    assert headless["spec"].get("clusterIP") == "None", \
        f"the StatefulSet's serviceName {headless['metadata']['name']!r} is not headless"
    assert headless["spec"]["selector"].items() <= agents.labels.items(), \
        f"headless Service selects {headless['spec']['selector']}; pods have {agents.labels}"
    env = {e["name"]: e for e in agents.container.get("env", [])}
    host = flag(agents, "--host", expand=False)
    var = re.fullmatch(r"\$\((\w+)\)", host)
    assert var and env[var.group(1)].get("valueFrom", {}).get("fieldRef", {}).get(
        "fieldPath") == "metadata.name", \
        f"{agents.where}: --host {host!r} should be $(VAR) with VAR from metadata.name"


def test_grace_periods_and_replicas_agree_with_the_flags(tmp_path: Path,
                                                         pod_env: pytest.MonkeyPatch) -> None:
    agents = the_agents()
    _, settings = parse_agent(agents, tmp_path, pod_env)
    grace = agents.pod.get("terminationGracePeriodSeconds", 30)
    assert settings.drain_timeout + settings.stop_grace < grace, \
        f"{agents.where}: --drain-timeout {settings.drain_timeout:g} + --stop-grace " \
        f"{settings.stop_grace:g} is not under terminationGracePeriodSeconds {grace}: the " \
        f"kubelet would kill a pod in the middle of its drain"
    _, config = parse_driver(the_driver(), tmp_path, pod_env)
    assert config.max_np is not None
    replicas = agents.workload["spec"].get("replicas", 1)
    assert config.min_np <= replicas * settings.slots <= config.max_np, \
        f"{agents.where}: {replicas} replicas x {settings.slots} slot(s) is outside " \
        f"--min-np {config.min_np} .. --max-np {config.max_np}"
    if "hpa.yaml" not in files():
        return
    hpa = find("HorizontalPodAutoscaler")
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("StatefulSet",
                                                agents.workload["metadata"]["name"]), \
        f"the HPA scales {target}, not the agents' StatefulSet"
    low, high = hpa["spec"].get("minReplicas", 1), hpa["spec"]["maxReplicas"]
    assert low * settings.slots >= config.min_np, \
        f"HPA minReplicas {low} x {settings.slots} slot(s) is under --min-np {config.min_np}"
    assert high * settings.slots <= config.max_np, \
        f"HPA maxReplicas {high} x {settings.slots} slot(s) is over --max-np {config.max_np}"
    policies = hpa["spec"].get("behavior", {}).get("scaleDown", {}).get("policies", [])
    assert policies and all(p["type"] == "Pods" and p["value"] == 1 for p in policies), \
        f"the HPA's scale-down policies {policies} do not remove one pod at a time"


def test_driver_and_agents_share_image_and_working_directory() -> None:
    agents, driver = the_agents(), the_driver()
    assert agents.container["image"] == driver.container["image"], \
        f"the agents run {agents.container['image']!r} but the driver's command is for " \
        f"{driver.container['image']!r}: the workers run the driver's COMMAND in the agents' pods"
    agent_dir = agents.container.get("workingDir")
    try:
        agent_dir = flag(agents, "--working-dir")
    except AssertionError:
        pass
    assert agent_dir == driver.container.get("workingDir"), \
        f"workers run in the driver's directory {driver.container.get('workingDir')!r}, " \
        f"but the agents' pods have {agent_dir!r}"
    for box in (agents, driver):
        assert box.pod.get("enableServiceLinks") is False, \
            f"{box.where}: enableServiceLinks is not false (Service variables would reach " \
            f"the workers' environment)"


def test_the_readme_says_what_was_not_run() -> None:
    text = " ".join((HERE / "README.md").read_text().split())
    assert "were **not** applied to a Kubernetes cluster" in text, \
        "examples/kubernetes/README.md should say the manifests were not run on a cluster"
