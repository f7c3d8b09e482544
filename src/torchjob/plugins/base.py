"""What a job plugin is: flags, checks, and pure changes to each pod and to the job's objects."""

from __future__ import annotations

from torchjob.errors import Issue
from torchjob.plugins.flags import Flag, parse_flags
from torchjob.records import record
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any, ClassVar

    from torchjob.addressing import Addressing
    from torchjob.spec.model import Job, Task

Issues = list[Issue]


@record
class PodContext:
    """One pod being created: the plugin changes ``pod`` (a fresh Pod manifest) in place."""

    job: Job
    task: Task
    index: int
    pod: dict[str, Any]
    addressing: Addressing

    @property
    def spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = self.pod["spec"]
        return spec

    def all_containers(self) -> list[dict[str, Any]]:
        """Init containers then containers, as present now."""
        return [*self.spec.get("initContainers", []), *self.spec.get("containers", [])]


class Plugin:
    """Base class: a plugin is built from its flag list and then asked about the job and each pod.

    Plugins do no I/O; everything about addresses and ports is asked of the Addressing.
    """

    name: ClassVar[str] = ""
    flags: ClassVar[tuple[Flag, ...]] = ()

    def __init__(self, args: list[str]) -> None:
        self.args = list(args)
        self.values, self.flag_errors = parse_flags(self.name, self.flags, self.args)

    def check(self, job: Job) -> Issues:
        """Problems of the job as this plugin sees it (flags are already checked)."""
        return []

    def warnings(self, job: Job, addressing: Addressing) -> Issues:
        """Things that are allowed but the user should know: issues of severity ``warning``."""
        return []

    def on_pod_create(self, ctx: PodContext) -> None:
        """Change the pod being created."""

    def job_objects(self, job: Job, addressing: Addressing) -> list[dict[str, Any]]:
        """Job-level Kubernetes objects this plugin owns (Service, ConfigMap, ...)."""
        return []

    def readdress(self, job: Job, pods: list[PodContext], was: Addressing) -> bool:
        """Rewrite in place, in pods this plugin changed under addressing ``was``, every value it
        took from the addressing, as each pod's ``addressing`` answers now: the pods a new
        expansion would build, for the price of a substitution. False: it cannot (the caller
        expands again). A plugin that asks the addressing in ``on_pod_create`` must override it."""
        return True

    # What an engine needs to know of the plugin's pods without reading their manifests back.

    def ports(self, job: Job) -> list[int]:
        """Ports this plugin makes the job's pods listen on (a local engine maps each to a host port)."""
        return []

    def rank(self, job: Job, task: Task, index: int) -> int | None:
        """The rank this plugin gives pod ``index`` of ``task``; None when it gives it none."""
        return None

    def added_init_containers(self, job: Job, task: Task) -> int:
        """How many init containers this plugin adds to each pod of ``task`` (an engine that runs
        each container as a job step counts them)."""
        return 0

    def config_mounts(self, job: Job) -> dict[str, str]:
        """ConfigMaps this plugin mounts into the job's containers: mount path -> ConfigMap name."""
        return {}
