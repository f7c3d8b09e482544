"""The pytorch, svc and env plugins reproduce Volcano's pod changes exactly.

Each test loads a job through the real loader (parse, defaults, validation), expands it and looks
at the pods and objects a cluster would get.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

import torchjob.plugins as plugins_package
from torchjob.expand import DesiredState, expand
from torchjob.jobs import load_jobs_from_text
from torchjob.plugins import PLUGIN_ORDER
from torchjob.plugins.waitmaster import wait_for_master_script
from torchjob.spec.model import Job

pytestmark = pytest.mark.timeout(60)


def container(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": "python:3.11", "command": ["python", "train.py"], **extra}


def task(name: str, replicas: int, *containers: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "name": name,
        "replicas": replicas,
        "template": {"spec": {"containers": list(containers) or [container(name)], **spec}},
    }


def job_doc(plugins: dict[str, list[str]], *tasks: dict[str, Any], name: str = "demo") -> dict[str, Any]:
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {"plugins": plugins, "tasks": list(tasks)},
    }


def load(doc: dict[str, Any]) -> Job:
    [loaded] = load_jobs_from_text(yaml.safe_dump(doc, sort_keys=False), "job.yaml")
    return loaded.job


def render(doc: dict[str, Any]) -> DesiredState:
    return expand(load(doc))


def pods(state: DesiredState) -> dict[str, dict[str, Any]]:
    return {p.name: p.manifest for p in state.pods}


def env_of(c: dict[str, Any]) -> dict[str, Any]:
    """name -> literal value, or the configMapKeyRef for valueFrom entries."""
    out: dict[str, Any] = {}
    for e in c.get("env", []):
        out[e["name"]] = e["value"] if "value" in e else e["valueFrom"]["configMapKeyRef"]
    return out


def env_names(c: dict[str, Any]) -> list[str]:
    return [e["name"] for e in c.get("env", [])]


def objects(state: DesiredState) -> dict[str, dict[str, Any]]:
    return {o["kind"]: o for o in state.objects}


PYTORCH_ENV = ["MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"]


# --------------------------------------------------------------------------------------- pytorch


def test_master_addr_port_world_size_and_rank_on_every_container() -> None:
    state = render(
        job_doc(
            {"pytorch": []},
            task("master", 1, container("main"), container("sidecar")),
            task("worker", 3),
        )
    )
    manifests = pods(state)
    assert list(manifests) == ["demo-master-0", "demo-worker-0", "demo-worker-1", "demo-worker-2"]
    expected_rank = {"demo-master-0": "0", "demo-worker-0": "1", "demo-worker-1": "2", "demo-worker-2": "3"}
    for name, pod in manifests.items():
        for c in pod["spec"]["containers"]:
            env = env_of(c)
            assert env["MASTER_ADDR"] == "demo-master-0.demo"
            assert env["MASTER_PORT"] == "23456"
            assert env["WORLD_SIZE"] == "4"
            assert env["RANK"] == expected_rank[name]
            assert {"name": "pytorchjob-port", "containerPort": 23456} in c["ports"]
    assert len(manifests["demo-master-0"]["spec"]["containers"]) == 2


def test_env_values_are_literal_strings_appended_after_user_env_in_volcano_order() -> None:
    user_env = [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]
    state = render(
        job_doc({"pytorch": []}, task("master", 1, container("m", env=user_env)), task("worker", 1))
    )
    master = pods(state)["demo-master-0"]["spec"]["containers"][0]
    names = env_names(master)
    assert names[:6] == ["A", "B", *PYTORCH_ENV]
    # svc is forced on by pytorch and adds its variables after pytorch's.
    assert names[6:] == ["VC_MASTER_HOSTS", "VC_MASTER_NUM", "VC_WORKER_HOSTS", "VC_WORKER_NUM"]
    for e in master["env"][:6]:
        assert set(e) == {"name", "value"} and isinstance(e["value"], str)


def test_master_addr_follows_master_template_hostname_and_subdomain() -> None:
    both = render(
        job_doc({"pytorch": []}, task("master", 1, hostname="boss", subdomain="net"), task("worker", 1))
    )
    sub_only = render(job_doc({"pytorch": []}, task("master", 1, subdomain="net"), task("worker", 1)))
    host_only = render(job_doc({"pytorch": []}, task("master", 1, hostname="boss"), task("worker", 1)))
    # A worker's own hostname does not matter: the address is the master's.
    worker_override = render(job_doc({"pytorch": []}, task("master", 1), task("worker", 1, hostname="w")))
    for state, addr in [
        (both, "boss.net"),
        (sub_only, "demo-master-0.net"),
        (host_only, "boss.demo"),
        (worker_override, "demo-master-0.demo"),
    ]:
        for pod in state.pods:
            assert env_of(pod.manifest["spec"]["containers"][0])["MASTER_ADDR"] == addr


def test_custom_master_worker_names_and_port() -> None:
    state = render(
        job_doc(
            {"pytorch": ["--master=chief", "--worker=trainer", "--port=29500"]},
            task("chief", 1),
            task("trainer", 2),
        )
    )
    for pod in state.pods:
        c = pod.manifest["spec"]["containers"][0]
        env = env_of(c)
        assert env["MASTER_ADDR"] == "demo-chief-0.demo"
        assert env["MASTER_PORT"] == "29500"
        assert env["WORLD_SIZE"] == "3"
        assert c["ports"] == [{"name": "pytorchjob-port", "containerPort": 29500}]
    assert [env_of(p.manifest["spec"]["containers"][0])["RANK"] for p in state.pods] == ["0", "1", "2"]


def test_world_size_counts_master_and_worker_only_and_other_tasks_get_no_rank() -> None:
    state = render(
        job_doc({"pytorch": []}, task("master", 1), task("worker", 2), task("evaluator", 3), task("ps", 4))
    )
    assert len(state.pods) == 10
    for pod in state.pods:
        env = env_of(pod.manifest["spec"]["containers"][0])
        assert env["WORLD_SIZE"] == "3"
        assert env["MASTER_ADDR"] == "demo-master-0.demo"
        task_name = pod.manifest["metadata"]["annotations"]["volcano.sh/task-spec"]
        if task_name in ("evaluator", "ps"):
            assert "RANK" not in env
            assert env_names(pod.manifest["spec"]["containers"][0])[:3] == PYTORCH_ENV[:3]
            assert "initContainers" not in pod.manifest["spec"] or all(
                ic["name"] != "wait-for-master" for ic in pod.manifest["spec"]["initContainers"]
            )
        else:
            assert "RANK" in env


def test_port_added_only_to_containers_lacking_that_port_number() -> None:
    has_it = container("a", ports=[{"name": "rdzv", "containerPort": 23456, "protocol": "TCP"}])
    has_other = container("b", ports=[{"name": "metrics", "containerPort": 9090}])
    has_none = container("c")
    state = render(
        job_doc({"pytorch": []}, task("master", 1, has_it, has_other, has_none), task("worker", 1))
    )
    a, b, c = pods(state)["demo-master-0"]["spec"]["containers"]
    assert a["ports"] == [{"name": "rdzv", "containerPort": 23456, "protocol": "TCP"}]
    assert b["ports"] == [
        {"name": "metrics", "containerPort": 9090},
        {"name": "pytorchjob-port", "containerPort": 23456},
    ]
    assert c["ports"] == [{"name": "pytorchjob-port", "containerPort": 23456}]


def test_pytorch_leaves_init_containers_alone() -> None:
    init = {"name": "setup", "image": "busybox:1.36.1", "command": ["true"]}
    state = render(job_doc({"pytorch": []}, task("master", 1), task("worker", 1, initContainers=[init])))
    worker = pods(state)["demo-worker-0"]["spec"]
    [setup] = worker["initContainers"]  # wait-for-master is off by default
    assert "ports" not in setup
    assert not set(PYTORCH_ENV) & set(env_names(setup))


def wait_containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in pod["spec"].get("initContainers", []) if c["name"] == "wait-for-master"]


def test_wait_for_master_only_on_worker_pods_and_only_when_enabled() -> None:
    off = render(job_doc({"pytorch": []}, task("master", 1), task("worker", 2)))
    assert all(not wait_containers(p.manifest) for p in off.pods)
    explicit_off = render(
        job_doc({"pytorch": ["--wait-master-enabled=false"]}, task("master", 1), task("worker", 2))
    )
    assert all(not wait_containers(p.manifest) for p in explicit_off.pods)

    on = render(
        job_doc({"pytorch": ["--wait-master-enabled"]}, task("master", 1), task("worker", 2), task("ps", 1))
    )
    by_name = pods(on)
    assert not wait_containers(by_name["demo-master-0"])
    assert not wait_containers(by_name["demo-ps-0"])
    for name in ("demo-worker-0", "demo-worker-1"):
        [wait] = wait_containers(by_name[name])
        assert wait["image"] == "busybox:1.36.1"
        assert wait["command"] == ["sh", "-c", wait_for_master_script("demo-master-0.demo", 23456, 300)]
        assert "args" not in wait and "resources" not in wait and "ports" not in wait
        assert not set(PYTORCH_ENV) & set(env_names(wait))


def test_wait_for_master_uses_the_flags_and_goes_after_user_init_containers() -> None:
    inits = [
        {"name": "fetch", "image": "busybox:1.36.1", "command": ["true"]},
        {"name": "unpack", "image": "busybox:1.36.1", "command": ["true"]},
    ]
    state = render(
        job_doc(
            {
                "pytorch": [
                    "--wait-master-enabled=true",
                    "--wait-master-timeout=42",
                    "--wait-master-image=registry.example.com/tools/bash:5.2",
                    "--port=29400",
                ]
            },
            task("master", 1, hostname="boss"),
            task("worker", 1, initContainers=inits),
        )
    )
    init = pods(state)["demo-worker-0"]["spec"]["initContainers"]
    assert [c["name"] for c in init] == ["fetch", "unpack", "wait-for-master"]
    wait = init[2]
    assert wait["image"] == "registry.example.com/tools/bash:5.2"
    assert wait["command"] == ["sh", "-c", wait_for_master_script("boss.demo", 29400, 42)]


def test_a_user_wait_for_master_container_is_kept_and_not_duplicated() -> None:
    mine = {"name": "wait-for-master", "image": "alpine:3.20", "command": ["sleep", "1"]}
    state = render(
        job_doc(
            {"pytorch": ["--wait-master-enabled"]},
            task("master", 1),
            task("worker", 2, initContainers=[mine]),
        )
    )
    for name in ("demo-worker-0", "demo-worker-1"):
        [wait] = wait_containers(pods(state)[name])
        assert wait["image"] == "alpine:3.20"
        assert wait["command"] == ["sleep", "1"]


def test_bad_port_name_collision_is_rejected() -> None:
    """Volcano would add a second port named pytorchjob-port, which Kubernetes refuses."""
    clash = container("m", ports=[{"name": "pytorchjob-port", "containerPort": 8080}])
    from torchjob.errors import SpecError

    with pytest.raises(SpecError) as err:
        load(job_doc({"pytorch": []}, task("master", 1, clash), task("worker", 1)))
    [problem] = err.value.problems
    assert "pytorchjob-port" in problem.message
    assert problem.path == "spec.tasks[0].template.spec.containers[0].ports[0].name"


# ------------------------------------------------------------------------------------------- svc


def test_svc_sets_hostname_and_subdomain_unless_the_template_does() -> None:
    state = render(
        job_doc(
            {"svc": []},
            task("a", 2),
            task("b", 1, hostname="fixed"),
            task("c", 1, subdomain="other"),
        )
    )
    spec = {name: pod["spec"] for name, pod in pods(state).items()}
    assert (spec["demo-a-0"]["hostname"], spec["demo-a-0"]["subdomain"]) == ("demo-a-0", "demo")
    assert (spec["demo-a-1"]["hostname"], spec["demo-a-1"]["subdomain"]) == ("demo-a-1", "demo")
    assert (spec["demo-b-0"]["hostname"], spec["demo-b-0"]["subdomain"]) == ("fixed", "demo")
    assert (spec["demo-c-0"]["hostname"], spec["demo-c-0"]["subdomain"]) == ("demo-c-0", "other")


def test_svc_configmap_holds_host_files_and_env_keys_per_task() -> None:
    state = render(
        job_doc(
            {"svc": []},
            task("master", 1),
            task("my-worker", 3),
            task("pinned", 4, hostname="fixed", subdomain="net"),
            task("idle", 0),
        )
    )
    cm = objects(state)["ConfigMap"]
    assert cm["metadata"] == {"name": "demo-svc", "namespace": "default"}
    workers = ["demo-my-worker-0.demo", "demo-my-worker-1.demo", "demo-my-worker-2.demo"]
    assert cm["data"] == {
        "master.host": "demo-master-0.demo",
        "VC_MASTER_HOSTS": "demo-master-0.demo",
        "VC_MASTER_NUM": "1",
        "my_worker.host": "\n".join(workers),
        "VC_MY_WORKER_HOSTS": ",".join(workers),
        "VC_MY_WORKER_NUM": "3",
        # A template hostname collapses the task to one host, whatever its replicas.
        "pinned.host": "fixed.net",
        "VC_PINNED_HOSTS": "fixed.net",
        "VC_PINNED_NUM": "1",
        "idle.host": "",
        "VC_IDLE_HOSTS": "",
        "VC_IDLE_NUM": "0",
    }


def test_svc_env_mount_and_volume_on_every_container_and_init_container() -> None:
    init = {"name": "setup", "image": "busybox:1.36.1", "command": ["true"]}
    state = render(
        job_doc(
            {"svc": []},
            task("head", 1, container("x"), container("y"), initContainers=[init]),
            task("my-worker", 2),
        )
    )
    expected_env = [f"VC_{t}_{kind}" for t in ("HEAD", "MY_WORKER") for kind in ("HOSTS", "NUM")]
    for pod in state.pods:
        spec = pod.manifest["spec"]
        every = [*spec.get("initContainers", []), *spec["containers"]]
        for c in every:
            assert env_names(c) == expected_env
            for e in c["env"]:
                assert e == {
                    "name": e["name"],
                    "valueFrom": {"configMapKeyRef": {"name": "demo-svc", "key": e["name"]}},
                }
            assert c["volumeMounts"] == [{"name": "demo-svc", "mountPath": "/etc/volcano"}]
        assert spec["volumes"] == [{"name": "demo-svc", "configMap": {"name": "demo-svc"}}]
    assert len(pods(state)["demo-head-0"]["spec"]["initContainers"]) == 1


def test_svc_appends_to_user_volumes_mounts_and_env() -> None:
    c = container(
        "main",
        env=[{"name": "X", "value": "1"}],
        volumeMounts=[{"name": "data", "mountPath": "/data"}],
    )
    state = render(job_doc({"svc": []}, task("only", 1, c, volumes=[{"name": "data", "emptyDir": {}}])))
    spec = state.pods[0].manifest["spec"]
    assert spec["volumes"] == [
        {"name": "data", "emptyDir": {}},
        {"name": "demo-svc", "configMap": {"name": "demo-svc"}},
    ]
    main = spec["containers"][0]
    assert main["volumeMounts"] == [
        {"name": "data", "mountPath": "/data"},
        {"name": "demo-svc", "mountPath": "/etc/volcano"},
    ]
    assert env_names(main) == ["X", "VC_ONLY_HOSTS", "VC_ONLY_NUM"]


def test_svc_headless_service_and_network_policy() -> None:
    state = render(job_doc({"svc": []}, task("a", 1)))
    objs = objects(state)
    assert [o["kind"] for o in state.objects] == ["ConfigMap", "Service", "NetworkPolicy"]
    selector = {"volcano.sh/job-name": "demo", "volcano.sh/job-namespace": "default"}
    assert objs["Service"] == {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "demo", "namespace": "default"},
        "spec": {"clusterIP": "None", "selector": selector, "publishNotReadyAddresses": False},
    }
    assert objs["NetworkPolicy"] == {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "demo", "namespace": "default"},
        "spec": {
            "podSelector": {"matchLabels": selector},
            "ingress": [{"from": [{"podSelector": {"matchLabels": selector}}]}],
            "policyTypes": ["Ingress"],
        },
    }
    # The selector matches the labels every pod of the job carries.
    labels = state.pods[0].manifest["metadata"]["labels"]
    assert selector.items() <= labels.items()


def test_svc_flags() -> None:
    state = render(
        job_doc(
            {
                "svc": [
                    "--publish-not-ready-addresses",
                    "--disable-network-policy",
                    "--inject-hosts-env=false",
                ]
            },
            task("a", 2),
        )
    )
    objs = objects(state)
    assert objs["Service"]["spec"]["publishNotReadyAddresses"] is True
    assert "NetworkPolicy" not in objs
    assert "VC_A_HOSTS" in objs["ConfigMap"]["data"]
    for pod in state.pods:
        c = pod.manifest["spec"]["containers"][0]
        assert "env" not in c or not [n for n in env_names(c) if n.startswith("VC_")]
        # The host files are still mounted.
        assert c["volumeMounts"] == [{"name": "demo-svc", "mountPath": "/etc/volcano"}]
        assert pod.manifest["spec"]["hostname"] == pod.name


def test_svc_uses_the_job_namespace() -> None:
    doc = job_doc({"svc": []}, task("a", 1))
    doc["metadata"]["namespace"] = "team-a"
    state = render(doc)
    for obj in [*state.objects, state.pods[0].manifest]:
        assert obj["metadata"]["namespace"] == "team-a"
    assert objects(state)["Service"]["spec"]["selector"]["volcano.sh/job-namespace"] == "team-a"


# ------------------------------------------------------------------------------------------- env


def test_env_plugin_sets_task_index_on_all_containers() -> None:
    init = {"name": "setup", "image": "busybox:1.36.1", "command": ["true"]}
    state = render(job_doc({"env": []}, task("a", 3, container("x"), container("y"), initContainers=[init])))
    for i, pod in enumerate(state.pods):
        spec = pod.manifest["spec"]
        for c in [*spec["initContainers"], *spec["containers"]]:
            assert c["env"] == [
                {"name": "VK_TASK_INDEX", "value": str(i)},
                {"name": "VC_TASK_INDEX", "value": str(i)},
            ]
        # env alone adds no svc objects or hostnames.
        assert "hostname" not in spec
    assert state.objects == []


# ----------------------------------------------------------------------------------------- order


def test_plugin_order_is_fixed_and_documented() -> None:
    assert PLUGIN_ORDER == ("pytorch", "kubeflow", "trainer", "jobset", "svc", "env")
    doc = plugins_package.__doc__ or ""
    assert doc.index("``pytorch``") < doc.index("``svc``") < doc.index("``env``")
    # The order in the YAML does not matter.
    a = render(job_doc({"env": [], "svc": [], "pytorch": []}, task("master", 1), task("worker", 1)))
    b = render(job_doc({"pytorch": [], "svc": [], "env": []}, task("master", 1), task("worker", 1)))
    assert [p.manifest for p in a.pods] == [p.manifest for p in b.pods]


def test_wait_for_master_container_gets_svc_and_env_additions() -> None:
    user_init = {"name": "setup", "image": "busybox:1.36.1", "command": ["true"]}
    state = render(
        job_doc(
            {"pytorch": ["--wait-master-enabled"], "env": []},
            task("master", 1),
            task("worker", 2, initContainers=[user_init]),
        )
    )
    worker = pods(state)["demo-worker-1"]["spec"]
    setup, wait = worker["initContainers"]
    assert wait["name"] == "wait-for-master"
    expected = [
        "VC_MASTER_HOSTS",
        "VC_MASTER_NUM",
        "VC_WORKER_HOSTS",
        "VC_WORKER_NUM",
        "VK_TASK_INDEX",
        "VC_TASK_INDEX",
    ]
    assert env_names(wait) == expected
    assert env_names(setup) == expected
    assert env_of(wait)["VC_TASK_INDEX"] == "1"
    assert wait["volumeMounts"] == [{"name": "demo-svc", "mountPath": "/etc/volcano"}]
    main = worker["containers"][0]
    assert env_names(main) == [*PYTORCH_ENV, *expected]


def test_plugins_report_their_ports_ranks_and_mounts_to_engines() -> None:
    """What an engine asks of plugins instead of knowing each one (issue 9)."""
    from torchjob.engines.local.ports import declared_ports
    from torchjob.plugins import build_plugins

    job = load(
        job_doc(
            {"pytorch": ["--master=master", "--worker=worker", "--port=29500"]},
            task("master", 1),
            task("worker", 2),
        )
    )
    plugins = {p.name: p for p in build_plugins(job)}
    assert plugins["pytorch"].ports(job) == [29500]
    assert declared_ports(job)[0] == 29500
    master, worker = job.spec.tasks
    assert [plugins["pytorch"].rank(job, worker, i) for i in range(2)] == [1, 2]
    assert plugins["pytorch"].rank(job, master, 0) == 0
    assert plugins["svc"].config_mounts(job) == {"/etc/volcano": f"{job.name}-svc"}
    assert plugins["svc"].ports(job) == [] and plugins["svc"].rank(job, master, 0) is None


def test_an_unknown_plugin_named_with_a_newline_is_reported_on_one_line() -> None:
    """A plugin name is a key the user wrote: its path is quoted, never a raw newline (found by
    tests/test_fuzz.py), and the line is the key's own."""
    from torchjob.errors import SpecError

    text = yaml.safe_dump(job_doc({"py\ntorch": []}, task("m", 1, container("m"))))
    with pytest.raises(SpecError) as raised:
        load_jobs_from_text(text, "job.yaml")
    message = str(raised.value)
    assert "\n" not in message.strip(), message
    assert 'spec.plugins["py\\ntorch"]: unknown plugin' in message
