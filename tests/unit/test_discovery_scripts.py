"""The ready-made discovery scripts in discovery_scripts/, run as real subprocesses.

Each external tool (kubectl, scontrol, aws) is replaced by a fake executable, first
on PATH, that checks the exact arguments it was called with and prints canned output
shaped like the real tool's. The scripts' stdout is read with elasticrun's own parser.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from elasticrun.discovery.parsing import parse_host_lines
from elasticrun.discovery.script import ScriptDiscovery
from elasticrun.job.errors import DiscoveryError

SCRIPTS = Path(__file__).resolve().parents[2] / "discovery_scripts"
ALL_SCRIPTS = ["static_file.py", "kubernetes.py", "slurm.py", "aws_asg.py"]

# The fake reads its calls from NAME.json beside it: a list of
# {"args": [...], "stdout": str, "stderr": str, "code": int, "sleep": float, "env": {...}}.
FAKE_TOOL = """#!{python}
import json, os, sys, time
here = os.path.dirname(os.path.abspath(__file__))
name = os.path.basename(__file__)
with open(os.path.join(here, name + ".json")) as f:
    calls = json.load(f)
for call in calls:
    if call["args"] == sys.argv[1:]:
        for key, value in call.get("env", {{}}).items():
            if os.environ.get(key) != value:
                sys.exit(f"fake {{name}}: expected env {{key}}={{value!r}}")
        time.sleep(call.get("sleep", 0))
        sys.stdout.write(call.get("stdout", ""))
        sys.stderr.write(call.get("stderr", ""))
        sys.exit(call.get("code", 0))
sys.exit(f"fake {{name}}: unexpected arguments {{sys.argv[1:]}}")
"""


@pytest.fixture
def bin_dir(tmp_path: Path) -> Path:
    """A PATH directory holding only python3 (for the scripts' shebang) and the fakes."""
    path = tmp_path / "bin"
    path.mkdir()
    (path / "python3").symlink_to(os.path.realpath(sys.executable))
    return path


def fake_tool(bin_dir: Path, name: str, calls: list[dict[str, Any]]) -> None:
    tool = bin_dir / name
    tool.write_text(FAKE_TOOL.format(python=sys.executable))
    tool.chmod(0o755)
    (bin_dir / f"{name}.json").write_text(json.dumps(calls))


def run_script(name: str, bin_dir: Path, *args: str, **env: str
               ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPTS / name), *args], env={"PATH": str(bin_dir), **env},
        capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)


def hosts_of(result: subprocess.CompletedProcess[str]) -> dict[str, int]:
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    return parse_host_lines(result.stdout, 99, "test")


def assert_clean_error(result: subprocess.CompletedProcess[str], script: str, code: int,
                       *phrases: str) -> None:
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"{script}: ")
    assert "Traceback" not in result.stderr
    for phrase in phrases:
        assert phrase in lines[0]


# --------------------------------------------------------------------------- all scripts


@pytest.mark.parametrize("script", ALL_SCRIPTS)
def test_scripts_are_executable_and_have_help(script: str, bin_dir: Path) -> None:
    assert os.access(SCRIPTS / script, os.X_OK)
    result = run_script(script, bin_dir, "--help")
    assert result.returncode == 0
    assert "Example" in result.stdout and "Exit codes" in result.stdout


@pytest.mark.parametrize("script", ALL_SCRIPTS)
def test_unknown_flag_is_one_line_usage_error(script: str, bin_dir: Path) -> None:
    assert_clean_error(run_script(script, bin_dir, "--bogus"), script, 2, "--bogus")


# --------------------------------------------------------------------------- static_file.py


def test_static_file_normalizes_every_form(tmp_path: Path, bin_dir: Path) -> None:
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("# training hosts\n\nnode1\nnode2:4\nnode3 slots=2   # MPI style\n"
                     "[fe80::0001]:2\n10.0.0.5:8\nnode1:3\n")
    result = run_script("static_file.py", bin_dir, "--file", str(hosts), "--default-slots", "1")
    assert result.stdout.splitlines() == [
        "node1:3", "node2:4", "node3:2", "[fe80::1]:2", "10.0.0.5:8"]
    assert hosts_of(result) == {"node1": 3, "node2": 4, "node3": 2, "fe80::1": 2, "10.0.0.5": 8}


def test_static_file_from_env_leaves_bare_hosts_to_elasticrun(tmp_path: Path,
                                                              bin_dir: Path) -> None:
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("a\nb:2\n")
    result = run_script("static_file.py", bin_dir, ELASTICRUN_HOSTS_FILE=str(hosts))
    assert result.stdout.splitlines() == ["a", "b:2"]
    assert parse_host_lines(result.stdout, 4, "test") == {"a": 4, "b": 2}


def test_static_file_missing_file(tmp_path: Path, bin_dir: Path) -> None:
    missing = tmp_path / "nope.txt"
    result = run_script("static_file.py", bin_dir, ELASTICRUN_HOSTS_FILE=str(missing))
    assert_clean_error(result, "static_file.py", 3, str(missing), "No such file")


def test_static_file_not_configured(bin_dir: Path) -> None:
    assert_clean_error(run_script("static_file.py", bin_dir), "static_file.py", 2,
                       "ELASTICRUN_HOSTS_FILE")


@pytest.mark.parametrize("line", ["node1:x", "node1 slots", "bad_host!", "a b c", "[fe80::1"])
def test_static_file_bad_line(tmp_path: Path, bin_dir: Path, line: str) -> None:
    hosts = tmp_path / "hosts.txt"
    hosts.write_text(f"good:1\n{line}\n")
    result = run_script("static_file.py", bin_dir, "--file", str(hosts))
    assert_clean_error(result, "static_file.py", 4, f"{hosts}:2:")


# --------------------------------------------------------------------------- kubernetes.py


def pod(name: str, ip: str, *, phase: str = "Running", ready: bool = True,
        deleting: bool = False, slots: str | None = None) -> dict[str, Any]:
    """A pod as `kubectl get pods -o json` prints it (trimmed to what matters)."""
    metadata: dict[str, Any] = {
        "name": name, "namespace": "default", "uid": f"uid-{name}",
        "labels": {"job": "train"}, "creationTimestamp": "2024-05-01T10:00:00Z"}
    if slots is not None:
        metadata["annotations"] = {"elasticrun.io/slots": slots}
    if deleting:
        metadata["deletionTimestamp"] = "2024-05-01T11:00:00Z"
        metadata["deletionGracePeriodSeconds"] = 30
    conditions = [
        {"type": "Initialized", "status": "True"},
        {"type": "Ready", "status": "True" if ready else "False"},
        {"type": "ContainersReady", "status": "True" if ready else "False"},
        {"type": "PodScheduled", "status": "True"}]
    status: dict[str, Any] = {"phase": phase, "conditions": conditions,
                              "hostIP": "192.168.1.10", "startTime": "2024-05-01T10:00:01Z"}
    if phase != "Pending":
        status["podIP"] = ip
        status["podIPs"] = [{"ip": ip}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata,
            "spec": {"containers": [{"name": "worker", "image": "train:1"}]}, "status": status}


def pod_list(*pods: dict[str, Any]) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": list(pods),
                       "metadata": {"resourceVersion": ""}}, indent=4)


MIXED_PODS = pod_list(
    pod("train-worker-2", "10.1.0.12", slots="4"),
    pod("train-worker-0", "10.1.0.10"),
    pod("train-worker-5", "10.1.0.15", ready=False),
    pod("train-worker-3", "", phase="Pending", ready=False),
    pod("train-worker-1", "10.1.0.11", deleting=True),
    pod("train-worker-4", "10.1.0.14", phase="Succeeded", ready=False),
    pod("train-worker-6", "10.1.0.16", slots="2"),
)
KUBECTL_ARGS = ["get", "pods", "-l", "job=train", "-o", "json"]


def test_kubernetes_ready_pods_by_ip(bin_dir: Path) -> None:
    fake_tool(bin_dir, "kubectl", [{"args": KUBECTL_ARGS, "stdout": MIXED_PODS}])
    result = run_script("kubernetes.py", bin_dir, ELASTICRUN_K8S_SELECTOR="job=train")
    assert result.stdout.splitlines() == ["10.1.0.10:1", "10.1.0.12:4", "10.1.0.16:2"]
    assert hosts_of(result) == {"10.1.0.10": 1, "10.1.0.12": 4, "10.1.0.16": 2}


def test_kubernetes_namespace_context_and_default_slots(bin_dir: Path) -> None:
    args = ["--context", "prod", "get", "pods", "-l", "app=bert,tier=gpu", "-n", "ml", "-o",
            "json"]
    fake_tool(bin_dir, "kubectl", [{"args": args, "stdout": MIXED_PODS}])
    result = run_script("kubernetes.py", bin_dir, "--selector", "app=bert,tier=gpu",
                        "--context", "prod", "--default-slots", "8",
                        ELASTICRUN_K8S_NAMESPACE="ml")
    assert hosts_of(result) == {"10.1.0.10": 8, "10.1.0.12": 4, "10.1.0.16": 2}


def test_kubernetes_address_name_with_domain(bin_dir: Path) -> None:
    fake_tool(bin_dir, "kubectl", [{"args": KUBECTL_ARGS, "stdout": MIXED_PODS}])
    result = run_script("kubernetes.py", bin_dir, "--address", "name", "--domain",
                        ".train.default.svc.cluster.local", ELASTICRUN_K8S_SELECTOR="job=train")
    assert list(hosts_of(result).items()) == [
        ("train-worker-0.train.default.svc.cluster.local", 1),
        ("train-worker-2.train.default.svc.cluster.local", 4),
        ("train-worker-6.train.default.svc.cluster.local", 2)]


def test_kubernetes_ipv6_pod_and_custom_annotation(bin_dir: Path) -> None:
    pods = [pod("w0", "fd00::a"), pod("w1", "10.1.0.11")]
    pods[0]["metadata"]["annotations"] = {"example.com/gpus": "2"}
    fake_tool(bin_dir, "kubectl", [{"args": KUBECTL_ARGS, "stdout": pod_list(*pods)}])
    result = run_script("kubernetes.py", bin_dir, "--slots-annotation", "example.com/gpus",
                        ELASTICRUN_K8S_SELECTOR="job=train")
    assert result.stdout.splitlines() == ["[fd00::a]:2", "10.1.0.11:1"]
    assert hosts_of(result) == {"fd00::a": 2, "10.1.0.11": 1}


def test_kubernetes_no_ready_pods_prints_nothing(bin_dir: Path) -> None:
    fake_tool(bin_dir, "kubectl", [{"args": KUBECTL_ARGS, "stdout": pod_list()}])
    result = run_script("kubernetes.py", bin_dir, ELASTICRUN_K8S_SELECTOR="job=train")
    assert hosts_of(result) == {}


@pytest.mark.parametrize("value", ["four", "-1", "5000", ""])
def test_kubernetes_bad_slots_annotation_names_the_pod(bin_dir: Path, value: str) -> None:
    pods = pod_list(pod("train-worker-0", "10.1.0.10"),
                    pod("train-worker-7", "10.1.0.17", slots=value))
    fake_tool(bin_dir, "kubectl", [{"args": KUBECTL_ARGS, "stdout": pods}])
    result = run_script("kubernetes.py", bin_dir, ELASTICRUN_K8S_SELECTOR="job=train")
    assert_clean_error(result, "kubernetes.py", 4, "train-worker-7", "elasticrun.io/slots")


def test_kubernetes_missing_selector(bin_dir: Path) -> None:
    assert_clean_error(run_script("kubernetes.py", bin_dir), "kubernetes.py", 2,
                       "ELASTICRUN_K8S_SELECTOR")


async def test_kubernetes_through_script_discovery(bin_dir: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The way the driver runs it: no arguments, inherited environment, a timeout."""
    fake_tool(bin_dir, "kubectl", [{"args": KUBECTL_ARGS, "stdout": MIXED_PODS}])
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("ELASTICRUN_K8S_SELECTOR", "job=train")
    discovery = ScriptDiscovery(SCRIPTS / "kubernetes.py", default_slots=1, timeout=20)
    hosts = await discovery.find_hosts()
    assert list(hosts.items()) == [("10.1.0.10", 1), ("10.1.0.12", 4), ("10.1.0.16", 2)]


async def test_script_discovery_reports_the_scripts_error_line(
        bin_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(bin_dir))  # no kubectl on it
    monkeypatch.setenv("ELASTICRUN_K8S_SELECTOR", "job=train")
    discovery = ScriptDiscovery(SCRIPTS / "kubernetes.py", default_slots=1, timeout=20)
    expected = (r"exited with code 3: kubernetes\.py: kubectl not found on PATH; "
                r"install it or set ELASTICRUN_KUBECTL")
    with pytest.raises(DiscoveryError, match=expected):
        await discovery.find_hosts()


# --------------------------------------------------------------------------- slurm.py


def test_slurm_nodes_of_the_allocation(bin_dir: Path) -> None:
    fake_tool(bin_dir, "scontrol", [{"args": ["show", "hostnames", "gpu[01-03],cpu7"],
                                     "stdout": "gpu01\ngpu02\ngpu03\ncpu7\n"}])
    result = run_script("slurm.py", bin_dir, SLURM_JOB_NODELIST="gpu[01-03],cpu7",
                        SLURM_NTASKS_PER_NODE="4")
    assert list(hosts_of(result).items()) == [("gpu01", 4), ("gpu02", 4), ("gpu03", 4),
                                              ("cpu7", 4)]


def test_slurm_flags_and_unusable_ntasks(bin_dir: Path) -> None:
    fake_tool(bin_dir, "scontrol", [{"args": ["show", "hostnames", "n[1-2]"],
                                     "stdout": "n1\nn2\n"}])
    result = run_script("slurm.py", bin_dir, "--nodelist", "n[1-2]",
                        SLURM_JOB_NODELIST="other[1-9]", SLURM_NTASKS_PER_NODE="2(x3)")
    assert hosts_of(result) == {"n1": 1, "n2": 1}
    result = run_script("slurm.py", bin_dir, "--nodelist", "n[1-2]", "--slots", "8",
                        SLURM_NTASKS_PER_NODE="4")
    assert hosts_of(result) == {"n1": 8, "n2": 8}


def test_slurm_outside_an_allocation(bin_dir: Path) -> None:
    fake_tool(bin_dir, "scontrol", [])
    assert_clean_error(run_script("slurm.py", bin_dir), "slurm.py", 2,
                       "not inside a Slurm allocation", "SLURM_JOB_NODELIST")


# --------------------------------------------------------------------------- aws_asg.py


def asg_instance(instance_id: str, state: str = "InService", health: str = "Healthy"
                 ) -> dict[str, Any]:
    return {"InstanceId": instance_id, "InstanceType": "p4d.24xlarge",
            "AvailabilityZone": "us-east-1a", "LifecycleState": state, "HealthStatus": health,
            "LaunchTemplate": {"LaunchTemplateId": "lt-0abc", "LaunchTemplateName": "train",
                               "Version": "3"},
            "ProtectedFromScaleIn": False}


def asg_output(*instances: dict[str, Any]) -> str:
    group = {"AutoScalingGroupName": "train-workers",
             "AutoScalingGroupARN": "arn:aws:autoscaling:us-east-1:123456789012:"
                                    "autoScalingGroup:uuid:autoScalingGroupName/train-workers",
             "MinSize": 0, "MaxSize": 8, "DesiredCapacity": len(instances),
             "DefaultCooldown": 300, "AvailabilityZones": ["us-east-1a"],
             "LoadBalancerNames": [], "TargetGroupARNs": [], "HealthCheckType": "EC2",
             "HealthCheckGracePeriod": 300, "Instances": list(instances),
             "CreatedTime": "2024-05-01T10:00:00.000Z", "SuspendedProcesses": [],
             "VPCZoneIdentifier": "subnet-0abc", "EnabledMetrics": [], "Tags": [],
             "TerminationPolicies": ["Default"], "NewInstancesProtectedFromScaleIn": False}
    return json.dumps({"AutoScalingGroups": [group]}, indent=4)


def ec2_instance(instance_id: str, ip: str, state: str = "running") -> dict[str, Any]:
    dns = "ip-" + ip.replace(".", "-") + ".ec2.internal"
    return {"AmiLaunchIndex": 0, "ImageId": "ami-0abc", "InstanceId": instance_id,
            "InstanceType": "p4d.24xlarge", "LaunchTime": "2024-05-01T10:00:00+00:00",
            "Placement": {"AvailabilityZone": "us-east-1a", "Tenancy": "default"},
            "PrivateDnsName": dns, "PrivateIpAddress": ip, "PublicDnsName": "",
            "State": {"Code": 16 if state == "running" else 32, "Name": state},
            "SubnetId": "subnet-0abc", "VpcId": "vpc-0abc",
            "NetworkInterfaces": [{"PrivateIpAddress": ip, "PrivateDnsName": dns}]}


def ec2_output(*reservations: list[dict[str, Any]]) -> str:
    return json.dumps({"Reservations": [
        {"Groups": [], "Instances": instances, "OwnerId": "123456789012",
         "RequesterId": "940372691376", "ReservationId": f"r-0{n}"}
        for n, instances in enumerate(reservations)]}, indent=4)


ASG_ARGS = ["autoscaling", "describe-auto-scaling-groups", "--auto-scaling-group-names",
            "train-workers", "--output", "json"]
ASG_MIXED = asg_output(
    asg_instance("i-0ccc"), asg_instance("i-0aaa"),
    asg_instance("i-0ddd", state="Terminating"),
    asg_instance("i-0eee", state="Pending"),
    asg_instance("i-0fff", state="Terminating:Wait"),
    asg_instance("i-0bbb", health="Unhealthy"))
EC2_ARGS = ["ec2", "describe-instances", "--instance-ids", "i-0aaa", "i-0ccc", "--output", "json"]
EC2_MIXED = ec2_output([ec2_instance("i-0ccc", "10.0.1.30")],
                       [ec2_instance("i-0aaa", "10.0.1.10")])


def test_aws_in_service_instances_by_ip(bin_dir: Path) -> None:
    fake_tool(bin_dir, "aws", [
        {"args": ASG_ARGS, "stdout": ASG_MIXED, "env": {"AWS_PAGER": ""}},
        {"args": EC2_ARGS, "stdout": EC2_MIXED, "env": {"AWS_PAGER": ""}}])
    result = run_script("aws_asg.py", bin_dir, ELASTICRUN_ASG_NAME="train-workers",
                        ELASTICRUN_ASG_SLOTS="8")
    assert result.stdout.splitlines() == ["10.0.1.10:8", "10.0.1.30:8"]
    assert hosts_of(result) == {"10.0.1.10": 8, "10.0.1.30": 8}


def test_aws_dns_address_and_region(bin_dir: Path) -> None:
    region = ["--region", "eu-west-1"]
    fake_tool(bin_dir, "aws", [{"args": ASG_ARGS + region, "stdout": ASG_MIXED},
                               {"args": EC2_ARGS + region, "stdout": EC2_MIXED}])
    result = run_script("aws_asg.py", bin_dir, "--group", "train-workers", "--address", "dns",
                        AWS_REGION="eu-west-1")
    assert list(hosts_of(result).items()) == [("ip-10-0-1-10.ec2.internal", 1),
                                              ("ip-10-0-1-30.ec2.internal", 1)]


def test_aws_skips_instances_ec2_no_longer_runs(bin_dir: Path) -> None:
    ec2 = ec2_output([ec2_instance("i-0aaa", "10.0.1.10", state="shutting-down"),
                      ec2_instance("i-0ccc", "10.0.1.30")])
    fake_tool(bin_dir, "aws", [{"args": ASG_ARGS, "stdout": ASG_MIXED},
                               {"args": EC2_ARGS, "stdout": ec2}])
    result = run_script("aws_asg.py", bin_dir, ELASTICRUN_ASG_NAME="train-workers")
    assert hosts_of(result) == {"10.0.1.30": 1}


def test_aws_no_in_service_instances_skips_ec2(bin_dir: Path) -> None:
    asg = asg_output(asg_instance("i-0eee", state="Pending"))
    fake_tool(bin_dir, "aws", [{"args": ASG_ARGS, "stdout": asg}])  # any ec2 call would fail
    result = run_script("aws_asg.py", bin_dir, ELASTICRUN_ASG_NAME="train-workers")
    assert hosts_of(result) == {}


def test_aws_unknown_group(bin_dir: Path) -> None:
    fake_tool(bin_dir, "aws", [{"args": ASG_ARGS, "stdout": '{"AutoScalingGroups": []}'}])
    result = run_script("aws_asg.py", bin_dir, ELASTICRUN_ASG_NAME="train-workers")
    assert_clean_error(result, "aws_asg.py", 4, "no Auto Scaling group named 'train-workers'")


def test_aws_missing_group(bin_dir: Path) -> None:
    assert_clean_error(run_script("aws_asg.py", bin_dir), "aws_asg.py", 2, "ELASTICRUN_ASG_NAME")


# --------------------------------------------------------------------------- tool problems

# script, its tool, env that configures it, the tool's arguments
TOOL_CASES = [
    ("kubernetes.py", "kubectl", {"ELASTICRUN_K8S_SELECTOR": "job=train"}, KUBECTL_ARGS),
    ("slurm.py", "scontrol", {"SLURM_JOB_NODELIST": "n[1-2]"}, ["show", "hostnames", "n[1-2]"]),
    ("aws_asg.py", "aws", {"ELASTICRUN_ASG_NAME": "train-workers"}, ASG_ARGS),
]


@pytest.mark.parametrize(("script", "tool", "env", "args"), TOOL_CASES)
def test_tool_not_installed(bin_dir: Path, script: str, tool: str, env: dict[str, str],
                            args: list[str]) -> None:
    result = run_script(script, bin_dir, **env)
    assert_clean_error(result, script, 3, f"{tool} not found on PATH")


@pytest.mark.parametrize(("script", "tool", "env", "args"), TOOL_CASES)
def test_tool_path_override(bin_dir: Path, tmp_path: Path, script: str, tool: str,
                            env: dict[str, str], args: list[str]) -> None:
    env_name = {"kubectl": "ELASTICRUN_KUBECTL", "scontrol": "ELASTICRUN_SCONTROL",
                "aws": "ELASTICRUN_AWS_CLI"}[tool]
    missing = str(tmp_path / "opt" / tool)
    result = run_script(script, bin_dir, **env, **{env_name: missing})
    assert_clean_error(result, script, 3, f"{missing} no such file", env_name)


@pytest.mark.parametrize(("script", "tool", "env", "args"), TOOL_CASES)
def test_tool_failure_reason_is_passed_on(bin_dir: Path, script: str, tool: str,
                                          env: dict[str, str], args: list[str]) -> None:
    reason = "error: You must be logged in to the server (Unauthorized)"
    fake_tool(bin_dir, tool, [{"args": args, "stderr": f"some detail\n{reason}\n", "code": 1}])
    result = run_script(script, bin_dir, **env)
    assert_clean_error(result, script, 4, "failed (exit code 1)", reason)


@pytest.mark.parametrize(("script", "tool", "env", "args"), TOOL_CASES)
def test_tool_garbage_output(bin_dir: Path, script: str, tool: str, env: dict[str, str],
                             args: list[str]) -> None:
    fake_tool(bin_dir, tool, [{"args": args, "stdout": "<html>Service Unavailable</html>\n"}])
    assert_clean_error(run_script(script, bin_dir, **env), script, 4)


@pytest.mark.parametrize("output", ['{"kind": "List"}', "[1, 2]", '{"items": [1, "x"]}'])
def test_kubernetes_unexpected_json(bin_dir: Path, output: str) -> None:
    fake_tool(bin_dir, "kubectl", [{"args": KUBECTL_ARGS, "stdout": output}])
    result = run_script("kubernetes.py", bin_dir, ELASTICRUN_K8S_SELECTOR="job=train")
    if output.startswith('{"items"'):
        assert hosts_of(result) == {}  # items that are not pods are not ready pods
    else:
        assert_clean_error(result, "kubernetes.py", 4, "not a JSON pod list")


@pytest.mark.parametrize(("script", "tool", "env", "args"), TOOL_CASES)
def test_hanging_tool_is_bounded(bin_dir: Path, script: str, tool: str, env: dict[str, str],
                                 args: list[str]) -> None:
    fake_tool(bin_dir, tool, [{"args": args, "sleep": 60}])
    start = time.monotonic()
    result = run_script(script, bin_dir, "--timeout", "0.5", **env)
    assert time.monotonic() - start < 10
    assert_clean_error(result, script, 4, "gave no answer within")
