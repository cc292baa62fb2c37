"""examples/kubernetes, checked without a cluster: every document parses, every container's
command parses with elasticrun's own command line, and the names the pieces share agree."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from elasticrun.agent.cli import agent_command
from elasticrun.cli import cli
from elasticrun.job_config import build_config

HERE = Path(__file__).resolve().parents[2] / "examples" / "kubernetes"
Doc = dict[str, Any]


def documents() -> list[Doc]:
    docs = []
    for path in sorted(HERE.glob("*.yaml")):
        docs += [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
    return docs


def one(kind: str, name: str | None = None) -> Doc:
    found = [d for d in documents() if d["kind"] == kind
             and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def pod_spec(workload: Doc) -> Doc:
    spec: Doc = workload["spec"]["template"]["spec"]
    return spec


def container(workload: Doc) -> Doc:
    [only] = pod_spec(workload)["containers"]
    return only  # type: ignore[no-any-return]


def argv(box: Doc) -> list[str]:
    """command + args, with $(VAR) taken from the container's env (as Kubernetes does)."""
    env = {e["name"]: e.get("value", f"<{e['name']}>") for e in box.get("env", [])}
    words = [*box.get("command", []), *box.get("args", [])]
    for word in words:
        for name in re.findall(r"\$\((\w+)\)", word):
            assert name in env, f"{box['name']}: $({name}) is not in the container's env"
    return [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)].strip("<>"), w) for w in words]


def flag(args: list[str], name: str) -> str:
    for i, word in enumerate(args):
        if word == name:
            return args[i + 1]
        if word.startswith(name + "="):
            return word.split("=", 1)[1]
    raise AssertionError(f"{name} not given in {args}")


def driver() -> Doc:
    return one("Job", "elasticrun-driver")


def agents() -> Doc:
    return one("StatefulSet")


def test_every_document_parses_and_is_named() -> None:
    docs = documents()
    assert {d["kind"] for d in docs} >= {"Secret", "Job", "Service", "StatefulSet",
                                        "HorizontalPodAutoscaler"}
    for doc in docs:
        assert doc.get("apiVersion") and doc.get("metadata", {}).get("name"), doc


def test_the_driver_command_parses_with_elasticruns_cli(tmp_path: Path) -> None:
    words = argv(container(driver()))
    assert words[0] == "elasticrun"
    context = cli.make_context("elasticrun", words[1:])
    options = dict(context.params)
    assert options["launcher"] == "agent" and options["port"] == 29400
    assert options["command"] == ("python", "/app/train.py")
    token = tmp_path / "token"
    token.write_text(secret_token())
    options["agent_token_file"] = token
    for name in ("log_level", "verbose", "timeline_filename", "timeline_mark_cycles"):
        options.pop(name, None)
    config = build_config(**options)
    assert config.uses_agents and config.discovery == "agents" and config.min_np == 2
    assert config.bind == ("0.0.0.0",)


def test_the_agent_command_parses_with_elasticruns_cli() -> None:
    words = argv(container(agents()))
    assert words[:2] == ["elasticrun", "agent"]
    options = agent_command.make_context("elasticrun agent", words[2:]).params
    assert options["host"] == "POD_NAME" and options["slots"] >= 1
    assert options["drain_timeout"] < pod_spec(agents())["terminationGracePeriodSeconds"], \
        "the pod is killed before its drain may end"


def secret_token() -> str:
    secret = one("Secret", "elasticrun-agent-token")
    token: str = secret["stringData"]["token"]
    return token


def test_the_token_is_long_enough() -> None:
    assert len(secret_token()) >= 16


def test_the_agents_dial_the_drivers_service_and_port() -> None:
    url = flag(argv(container(agents())), "--driver")
    match = re.fullmatch(r"http://([\w.-]+):(\d+)", url)
    assert match, url
    service = one("Service", match.group(1))
    [port] = service["spec"]["ports"]
    assert port["port"] == int(match.group(2))
    [container_port] = container(driver())["ports"]
    assert port["targetPort"] in (container_port["name"], container_port["containerPort"])
    assert container_port["containerPort"] == int(flag(argv(container(driver())), "--port"))
    labels = driver()["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items(), "the Service selects no driver"


@pytest.mark.parametrize(("workload", "token_flag"), [(driver, "--agent-token-file"),
                                                      (agents, "--token-file")])
def test_the_token_file_is_the_mounted_secret(workload: Any, token_flag: str) -> None:
    spec, box = pod_spec(workload()), container(workload())
    path = Path(flag(argv(box), token_flag))
    [mount] = [m for m in box["volumeMounts"] if path.parent == Path(m["mountPath"])]
    [volume] = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    secret = one("Secret", volume["secret"]["secretName"])
    assert path.name in secret["stringData"], f"{path.name} is not a key of the Secret"


def test_probes_match_the_flags() -> None:
    box = container(agents())
    assert box["readinessProbe"]["exec"]["command"][-1] == flag(argv(box), "--ready-file")
    driver_box = container(driver())
    assert driver_box["readinessProbe"]["httpGet"]["path"] == "/status"
    assert driver_box["readinessProbe"]["httpGet"]["port"] == driver_box["ports"][0]["name"]


def test_selectors_and_names_agree() -> None:
    statefulset = agents()
    labels = statefulset["spec"]["template"]["metadata"]["labels"]
    assert statefulset["spec"]["selector"]["matchLabels"].items() <= labels.items()
    headless = one("Service", statefulset["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    target = one("HorizontalPodAutoscaler")["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("StatefulSet",
                                                statefulset["metadata"]["name"])
