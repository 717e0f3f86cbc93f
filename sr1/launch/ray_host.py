"""A part of a run on a Ray node: the actor that runs its process there, the slot it holds, the driver's handle.

    slot = Slot("generators", 0, placement_group, {"CPU": 1, "GPU": 1})   # one bundle of a pool's placement group
    slot.actor = host_class().options(...).remote(os.getcwd())           # a `PartHost` in that bundle
    child = RemoteChild.adopting(Child("generator-0", cmd, log_path), slot, supervisor).start()
    child.alive, child.returncode, child.failure()                       # asked of the slot's actor

Each slot of a pool is a small Ray actor (`PartHost`) in one bundle of the pool's placement group. It runs the part's
process as a `Child` on its node (own process group, log file there, killed with the actor) and answers for it. On
the driver each process is a `RemoteChild`, so the one `Supervisor` (`RaySupervisor`, sr1/launch/ray.py) restarts
and stops it as it does a local child; a `RemoteChild` whose actor was lost reports the exit code `LOST` and gets a
new actor in the same bundle from its supervisor when started again. The part gets the driver's environment that
Ray's workers do not inherit (`forwarded_env`) and its job files, written on a node that lacks them (`job_files`).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import signal
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from sr1.launch.supervisor import Child, tail

STATUS_TTL_S = 0.5  # a RemoteChild asks its host again after this long
CALL_TIMEOUT_S = (
    30.0  # a host that does not answer a short call in this long counts as unreachable (not dead)
)
LOST = -signal.SIGKILL  # the exit code reported for a process whose Ray actor (or node) was lost
# the driver's environment the parts need and Ray's workers do not inherit from it
FORWARDED_ENV_PREFIXES = (
    "HF_",
    "TRANSFORMERS_",
    "TOKENIZERS_",
    "VLLM_",
    "NCCL_",
    "GLOO_",
    "TORCH_",
    "WANDB_",
)
FORWARDED_ENV = ("OMP_NUM_THREADS", "PYTHONPATH", "CUDA_LAUNCH_BLOCKING")


def forwarded_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The driver's variables every part gets (model hub, vLLM, NCCL, wandb, threads)."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items() if k in FORWARDED_ENV or k.startswith(FORWARDED_ENV_PREFIXES)}


def job_files(cmd: list[str]) -> dict[str, str]:
    """The YAML files a command names (its job config), to be written on a node that lacks them."""
    files = {}
    for arg in cmd:
        if arg.endswith((".yaml", ".yml")) and os.path.isfile(arg):
            files[os.path.abspath(arg)] = Path(arg).read_text()
    return files


class PartHost:
    """A Ray actor (one per slot) that runs one part's process on its node and reports on it."""

    def __init__(self, cwd: str):
        if os.path.isdir(cwd):  # relative paths in a user's config mean what they mean on the driver
            os.chdir(cwd)
        # Ray sets OMP_NUM_THREADS to the actor's CPUs; a part sets its own threads (the driver's value is forwarded)
        os.environ.pop("OMP_NUM_THREADS", None)
        self.child: Child | None = None

    def where(self) -> dict[str, Any]:
        import ray

        return {
            "ip": ray.util.get_node_ip_address(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "hostname": socket.gethostname(),
            "actor_pid": os.getpid(),
            "gpus": [str(g) for g in ray.get_gpu_ids()],
        }

    def free_port(self) -> int:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            return s.getsockname()[1]

    def start(
        self, name: str, cmd: list[str], env: dict[str, str], log_path: str | None, files: dict[str, str]
    ) -> int:
        for path, text in files.items():
            target = Path(path)
            if not target.is_file() or target.read_text() != text:
                target.parent.mkdir(parents=True, exist_ok=True)
                temp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
                temp.write_text(text)
                temp.replace(target)
        self.child = Child(name, cmd, Path(log_path) if log_path else None, env).start()
        return self.child.pid

    def status(self) -> dict[str, Any]:
        child = self.child
        if child is None:
            return {"pid": None, "returncode": None, "group_alive": False, "last_line": ""}
        last = tail(child.log_path, 1) if child.log_path else ""
        return {
            "pid": child.pid,
            "returncode": child.returncode,
            "group_alive": child.group_alive(),
            "last_line": last,
        }

    def tail(self, lines: int) -> str:
        if self.child is None or self.child.log_path is None:
            return "(output not captured: see the driver's console)"
        return tail(self.child.log_path, lines)

    def send(self, sig: int) -> None:
        if self.child is not None:
            self.child.send(sig)

    def stop(self, grace_s: float, first: int) -> int | None:
        return None if self.child is None else self.child.stop(grace_s=grace_s, first=first)


@functools.cache
def host_class():
    """`PartHost` as a Ray actor class (made once, on first use: Ray is imported only by runs that use it)."""
    import ray

    return ray.remote(max_restarts=0)(PartHost)


@dataclass
class Slot:
    """One bundle of a pool's placement group and the actor that runs a part there."""

    pool: str
    index: int
    placement_group: Any
    bundle: dict[str, float]
    actor: Any = None
    where: dict[str, Any] = field(default_factory=dict)  # ip, node_id, hostname, actor_pid, gpus
    child_name: str | None = None

    @property
    def ip(self) -> str:
        return self.where.get("ip", "?")

    @property
    def node(self) -> str:
        """Host name, address and the start of the Ray node id."""
        return f"{self.where.get('hostname', '?')} {self.ip} {self.where.get('node_id', '?')[:8]}"


class ActorReplacer(Protocol):
    """What a `RemoteChild` asks of its supervisor (`RaySupervisor`): a new actor in a slot whose actor was lost."""

    def replace_actor(self, slot: Slot, timeout_s: float = 600.0) -> None: ...


@dataclass
class RemoteChild(Child):
    """A `Child` whose process runs in a Ray slot; its state is asked of the slot's actor (cached briefly)."""

    slot: Slot | None = None
    supervisor: ActorReplacer | None = None
    lost: str = ""  # why the slot's actor is gone, when it is
    _status: dict[str, Any] = field(
        default_factory=lambda: {"pid": None, "returncode": None, "group_alive": False, "last_line": ""}
    )
    _status_at: float = 0.0

    @classmethod
    def adopting(cls, child: Child, slot: Slot, supervisor: ActorReplacer) -> RemoteChild:
        values = {f.name: getattr(child, f.name) for f in dataclasses.fields(Child)}
        return cls(**values, slot=slot, supervisor=supervisor)

    # -- state ---------------------------------------------------------------------------------------------------
    def apply_status(self, status: dict[str, Any] | None, lost: str = "") -> None:
        """Record an answer of the slot's actor (None with `lost`: the actor is gone, and the process with it)."""
        if status is None:
            self.lost = lost
            had = self._status.get("pid")
            self._status = {
                "pid": had,
                "returncode": LOST if had else None,
                "group_alive": False,
                "last_line": "",
            }
        else:
            self._status = status
        self._status_at = time.monotonic()

    def refresh(self) -> None:
        import ray

        try:
            self.apply_status(ray.get(self.slot.actor.status.remote(), timeout=CALL_TIMEOUT_S))
        except ray.exceptions.GetTimeoutError:
            self._status_at = time.monotonic()  # busy (stopping its process): keep what we knew
        except ray.exceptions.RayActorError as err:
            self.apply_status(None, lost=f"its Ray actor was lost ({type(err).__name__}: {err})"[:400])

    def _state(self) -> dict[str, Any]:
        if (
            self.slot is not None
            and self.slot.actor is not None
            and (time.monotonic() - self._status_at > STATUS_TTL_S)
        ):
            self.refresh()
        return self._status

    @property
    def pid(self) -> int | None:
        return self._status.get("pid")

    @property
    def alive(self) -> bool:
        state = self._state()
        return state["pid"] is not None and state["returncode"] is None

    @property
    def returncode(self) -> int | None:
        return self._state()["returncode"]

    @property
    def last_line(self) -> str:
        return self._status.get("last_line", "")

    def group_alive(self) -> bool:
        return bool(self._state()["group_alive"])

    # -- control -----------------------------------------------------------------------------------------------
    def start(self) -> RemoteChild:
        import ray

        if self.lost or self.slot.actor is None:
            self.supervisor.replace_actor(self.slot)
            self.lost = ""
        env = {**forwarded_env(), **{k: v for k, v in self.env.items() if k != "CUDA_VISIBLE_DEVICES"}}
        log_path = str(self.log_path) if self.log_path is not None else None
        call = self.slot.actor.start.remote(self.name, self.cmd, env, log_path, job_files(self.cmd))
        pid = ray.get(call, timeout=CALL_TIMEOUT_S)
        self.apply_status({"pid": pid, "returncode": None, "group_alive": True, "last_line": ""})
        self.slot.child_name = self.name
        return self

    def send(self, sig: int) -> None:
        if self.slot.actor is not None and not self.lost:
            self.slot.actor.send.remote(sig)  # no wait: a signal handler calls this

    def stop(self, grace_s: float = 30.0, first: int = signal.SIGINT) -> int | None:
        import ray

        if self.pid is None or self.lost:
            return self._status.get("returncode")
        try:
            code = ray.get(self.slot.actor.stop.remote(grace_s, first), timeout=grace_s + 20 + CALL_TIMEOUT_S)
        except (
            ray.exceptions.GetTimeoutError
        ):  # its host hangs: the actor goes, and the process group with it
            ray.kill(self.slot.actor)
            self.apply_status(None, lost="its Ray actor hung while stopping it and was killed")
            return LOST
        except ray.exceptions.RayActorError as err:
            self.apply_status(None, lost=f"its Ray actor was lost ({type(err).__name__})")
            return LOST
        self.apply_status(
            {"pid": self.pid, "returncode": code, "group_alive": False, "last_line": self.last_line}
        )
        return code

    def failure(self) -> str:
        import ray

        where = f"{self.log_path} on {self.slot.node}" if self.log_path else self.slot.node
        if self.lost:
            return f"{self.name} on {self.slot.node}: {self.lost}"
        try:
            last = ray.get(self.slot.actor.tail.remote(25), timeout=CALL_TIMEOUT_S)
        except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError) as err:
            last = f"(could not read it: {type(err).__name__})"
        return f"{self.name} exited with code {self.returncode}; last log lines ({where}):\n{last}"
