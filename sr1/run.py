"""`sr1 run`: the whole asynchronous system on this machine, each pool its own process.

    sr1 run                                  # the embedded tiny default (CPU, minutes)
    sr1 run tiny learner.max_staleness=0     # the synchronous baseline, same report
    sr1 run --resume runs/tiny-20261121-231500

Order: tiny world (if the model is `tiny`) -> Redis (embedded unless buffer.redis_url) -> retrieval server and
generator workers, side by side -> greedy evaluation before training -> learner -> live view -> evaluation after ->
report. Each phase says what it is waiting for and about how long is left.

Every part is supervised: a dead Redis, retrieval server, generator or learner is restarted with back-off (the
learner with `--resume`; the others ride out the gap), and the run fails with the dead part's last log lines only
when one keeps dying. Children die with `sr1 run` (never orphans), and one run directory has one owner (a lock).
Ctrl-C stops everything cleanly (the learner checkpoints first) and prints the resume command; `--resume` goes on
from whatever is left, whatever was killed and whenever.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from buffer.connection import RETRIED as REDIS_UNAVAILABLE
from buffer.memory import EvictingRedis
from buffer.monitor import serve_configured_metrics
from buffer.redis_buffer import open_buffer
from config import (
    EXIT_BAD_INPUT,
    EXIT_CHECKPOINT_FAILED,
    Config,
    ConfigError,
    load_config,
    save_config,
    save_job,
    secret_env,
)
from evaluation import Evaluations, read_evals
from learner.tracking import Tracker
from sr1 import entrypoints
from sr1.embedded import EMBEDDED_MODELS, RUNS_ROOT, build_embedded, with_embedded_world
from sr1.launch.lock import RunLock, RunLocked
from sr1.launch.pools import generator_children, learner_children
from sr1.launch.redis_outages import OWN_RECONNECT_S, ride_out_redis, withdraw_dead_learners_group
from sr1.launch.redis_server import run_redis
from sr1.launch.supervisor import (
    Child,
    ChildFailed,
    RestartPolicy,
    Supervisor,
    free_port,
    http_ok,
    python_module,
)
from sr1.live import LiveView
from sr1.preflight import BadInput, check_inputs
from sr1.report import write_report
from sr1.summary import summarize

# typical times on a 2-core CPU for the tiny preset: the progress lines' "about N s left" before anything is measured
ENGINE_START_S = 40.0
EVAL_S = 25.0
T = TypeVar("T")


def build_parser(prog: str = "sr1 run", description: str | None = __doc__) -> argparse.ArgumentParser:
    """`sr1 run`'s arguments (`sr1 launch` adds its own to the same)."""
    parser = argparse.ArgumentParser(
        prog=prog, description=description, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("preset", nargs="?", default="tiny", help="preset name or YAML path (default: tiny)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. learner.max_staleness=0")
    parser.add_argument("--resume", type=Path, help="continue the run in this directory (its config.yaml)")
    parser.add_argument("--run-dir", type=Path, help="where to write the run (default: runs/<name>-<time>)")
    parser.add_argument("--no-live", action="store_true", help="plain log lines instead of the live table")
    parser.add_argument("--startup-timeout", type=float, default=600.0, help="seconds to wait for each pool")
    return parser


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    args = parser.parse_intermixed_args(argv)
    if "=" in args.preset:  # `sr1 run learner.max_staleness=0`: the first positional is an override
        args.overrides.insert(0, args.preset)
        args.preset = "tiny"
    return args


def _resolve(args: argparse.Namespace) -> tuple[Config, Path]:
    if args.resume is not None:
        run_dir = args.resume
        if not (run_dir / "config.yaml").is_file():
            raise ConfigError(f"--resume {run_dir}: no config.yaml there (not a run directory)")
        return load_config(run_dir / "config.yaml", args.overrides), run_dir
    cfg = load_config(args.preset, args.overrides)
    run_dir = args.run_dir or cfg.run_dir or RUNS_ROOT / f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    return cfg, Path(run_dir)


def _update(cfg: Config, section: str, **values: Any) -> Config:
    return cfg.model_copy(update={section: getattr(cfg, section).model_copy(update=values)})


class Orchestrator:
    """Starts the pools, watches them, evaluates, writes the report; always stops what it started."""

    command = "sr1 run"  # how a user names this launcher (the run lock's owner, the resume hint)

    def __init__(self, cfg: Config, run_dir: Path, *, resume: bool, live: bool, startup_timeout_s: float):
        self.cfg = cfg
        self.run_dir = run_dir.resolve()
        self.resume = resume
        self.live = live
        self.startup_timeout_s = startup_timeout_s
        self.lock = RunLock(self.run_dir, self.command)
        self.supervisor = Supervisor()
        self.redis_server = None
        self.metrics = None
        self.buffer = None
        self.started = time.monotonic()
        self.view = None
        self.inputs_checked = False
        self._eval_s = (
            EVAL_S  # what an evaluation is expected to take (the last one's time, once there was one)
        )

    # -- set-up -------------------------------------------------------------------------------------------------

    def check_inputs(self) -> None:
        """The embedded world (if asked for), then the model, tokenizer and prompt files checked before anything
        starts: BadInput lists every problem (sr1/preflight.py). Done once, before any pool is placed."""
        if self.inputs_checked:
            return
        cfg = self.cfg
        if cfg.model.path in EMBEDDED_MODELS:
            cfg = with_embedded_world(cfg)
        for note in check_inputs(cfg):
            print(f"{self.command}: {note}", flush=True)
        self.cfg, self.inputs_checked = cfg, True

    def prepare(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.lock.acquire()  # before anything writes into the run directory
        self.supervisor.pass_fds = (self.lock.fd,)  # held by every child too: no second stack while one lives
        self.check_inputs()
        cfg = self.cfg.model_copy(update={"run_dir": self.run_dir})
        given_token = cfg.retrieval.token
        if cfg.retrieval.serves_locally:
            cfg = self._place_retrieval(cfg)
        # the run's config as a user would resume it: a local Redis is started again on its AOF, at a new port, and a
        # retrieval token the launcher made (`sr1 launch`) is made again; one the user gave is kept, masked (a resume
        # asks for it again: docs/measurements/security.md, "Secrets")
        resumable = cfg.model_copy(
            update={"retrieval": cfg.retrieval.model_copy(update={"token": given_token})}
        )
        self.config_path = save_config(resumable, self.run_dir)
        if cfg.buffer.redis_url is None:
            cfg = self._start_redis(cfg)
        self.cfg = cfg

        # this process restarts Redis when it dies, so it must not sit in a long retry itself: its calls fail
        # fast and `_riding_out_redis` retries them between supervisor checks (also this first one: a Redis that
        # dies right after it started is restarted here, as later in the run)
        own = cfg.buffer.model_copy(update={"reconnect_s": OWN_RECONNECT_S})
        self.buffer = self._riding_out_redis(lambda: open_buffer(own))
        self._riding_out_redis(lambda: withdraw_dead_learners_group(self.buffer))
        try:
            self.metrics = serve_configured_metrics(self.buffer, cfg.buffer)
        except OSError as err:
            raise BadInput([str(err)]) from err
        if self.metrics is not None:
            print(
                f"{self.command}: Prometheus /metrics on {self.metrics.host}:{self.metrics.port}", flush=True
            )

    def _place_retrieval(self, cfg: Config) -> Config:
        """Where the run's own retrieval server listens: a free loopback port (`sr1 launch`: on its Ray node)."""
        port = free_port()
        return cfg.model_copy(update={"retrieval": cfg.retrieval.served_at(port)})

    def _start_redis(self, cfg: Config) -> Config:
        """The run's own Redis (no buffer.redis_url): a local redis-server on the run's AOF, supervised, with a
        password made for this start and an ACL user allowed the namespace's keys only (sr1/launch/redis_server.py)."""
        self.redis_server = run_redis(self.run_dir, cfg.buffer, pass_fds=self.supervisor.pass_fds).start()
        # restarted on its port, AOF and ACL file when it dies; every client rides out the gap (buffer.reconnect_s)
        self.redis_server.child.restart = RestartPolicy()
        self.supervisor.adopt(self.redis_server.child)
        return _update(cfg, "buffer", redis_url=self.redis_server.url)

    def _child(
        self,
        name: str,
        cmd: list[str],
        restart: RestartPolicy | None = None,
        env: dict[str, str] | None = None,
    ) -> Child:
        log_path = self.run_dir / "logs" / f"{name}.log"
        return self.supervisor.start(Child(name, cmd, log_path, env or {}, restart=restart))

    def launch_retrieval(self) -> None:
        """Start the run's retrieval server (when it serves locally); `wait_for_retrieval` waits for its health."""
        if not self.cfg.retrieval.serves_locally:
            return  # online engines need no local server
        job = self.cfg.retrieval_job()
        job_file = save_job(job, self.run_dir / "jobs" / "retrieval.yaml")  # its token masked: given in env
        # while it restarts, searches fail after the client's retries and agents read "Search unavailable"
        cmd = python_module(entrypoints.RETRIEVAL, "serve", "--config", str(job_file))
        self._child("retrieval", cmd, RestartPolicy(), env=secret_env(job))

    def wait_for_retrieval(self) -> None:
        if not self.cfg.retrieval.serves_locally:
            return
        health = self.cfg.retrieval.client.url.rsplit("/", 1)[0] + "/health"
        self.supervisor.wait_until(
            lambda: http_ok(health), timeout_s=self.startup_timeout_s, what="the retrieval server"
        )

    def start_retrieval(self) -> None:
        self.launch_retrieval()
        self.wait_for_retrieval()

    def launch_generators(self) -> None:
        """Start the generator workers; `wait_for_generators` waits until each heartbeats (its engine is up)."""
        for child in generator_children(self.cfg, self.cfg.generators.num_engines, "generator-", logs=True):
            # a restarted worker takes back its leases and waits for the weights
            child.restart = RestartPolicy()
            self.supervisor.start(child)

    def wait_for_generators(self) -> None:
        wanted = self.cfg.generators.num_engines
        self.supervisor.wait_until(
            lambda: self._riding_out_redis(lambda: self._count_generators() >= wanted),
            timeout_s=self.startup_timeout_s,
            what=f"{wanted} generator worker(s) to heartbeat",
        )

    def start_generators(self) -> None:
        self.launch_generators()
        self.wait_for_generators()

    def start_serving(self) -> None:
        """The retrieval server and the generator workers, started side by side: an engine needs the server only
        when it first searches, and its start (processes, imports, weights, KV cache) is most of the wait."""
        engines = self.cfg.generators.num_engines
        what = f"starting the retrieval server and {engines} vLLM engine(s)"
        with self.view.phase(what, expected_s=ENGINE_START_S):
            self.launch_retrieval()
            self.launch_generators()
            self.wait_for_retrieval()
            self.wait_for_generators()

    def _count_generators(self) -> int:
        return sum(1 for w in self.buffer.workers() if w.get("role") == "generator")

    def start_learner(self) -> list[Child]:
        ranks = learner_children(self.cfg, self.resume, logs=True)
        for rank in ranks:
            rank.restart = RestartPolicy()
            rank.restart_cmd = rank.cmd if "--resume" in rank.cmd else [*rank.cmd, "--resume"]
            rank.gang = "learner"  # ranks share collectives: one dies, all restart
        return [self.supervisor.start(rank) for rank in ranks]

    # -- evaluation -----------------------------------------------------------------------------------------

    def evaluate(self, step: int) -> dict[str, Any]:
        """Evaluate the policy at version `step` (or newer) on the generator workers, and record it."""
        evals = Evaluations(self.buffer, self.cfg.eval, self.run_dir)
        what = f"evaluating the policy at version {step} (greedy, test split)"
        started = time.monotonic()
        with self.view.phase(what, expected_s=self._eval_s):
            eval_id = self._riding_out_redis(lambda: evals.request(step))
            result = self._riding_out_redis(lambda: evals.wait(eval_id, self.startup_timeout_s))
        self._eval_s = time.monotonic() - started  # the next evaluation's estimate
        tracker = Tracker(
            self.run_dir, self.cfg.logging
        )  # metrics.jsonl and wandb, as the learner's evaluations
        tracker.log_eval(result, step=step)
        tracker.close()
        return result

    @property
    def evals(self) -> list[dict[str, Any]]:
        """Every evaluation the run recorded so far: before and after by this process, during by the learner."""
        return read_evals(self.run_dir)

    # -- supervision ----------------------------------------------------------------------------------------

    def _supervise(self) -> None:
        for child in self.supervisor.check():
            message = f"restarted {child.name} (it died; see {child.log_path})"
            self.view.log(message) if self.view is not None else print(message)

    def _riding_out_redis(self, call: Callable[[], T]) -> T:
        """`call()`, retried while Redis is down for up to `buffer.reconnect_s`, supervising meanwhile."""
        return ride_out_redis(call, self.cfg.buffer.reconnect_s, self._supervise)

    # -- the run --------------------------------------------------------------------------------------------

    def make_view(self):
        """The live view (`sr1 launch` adds where each part runs)."""
        return LiveView(self, enabled=self.live)

    def run(self) -> int:
        self.prepare()
        self.view = view = self.make_view()
        view.log(f"run directory: {self.run_dir}")
        self.start_serving()
        if not any(e["step"] == 0 for e in self.evals):
            first = self.evaluate(0)
            view.log(f"test EM before: {first['eval/em']:.3f}")
        view.log("starting learner")
        learner = self.start_learner()  # it asks for the evaluations during training (eval.every_steps)
        with view:
            while not all(rank.returncode == 0 for rank in learner):
                self._supervise()
                self._riding_out_redis(view.refresh)
                time.sleep(1.0)
        final_version = self._riding_out_redis(self.buffer.version)
        last = next((e for e in self.evals if e["step"] == final_version), None)
        if last is None:  # the learner evaluates its last step itself when it evaluates during training
            view.log(f"training done at version {final_version}; evaluating the final policy")
            last = self.evaluate(final_version)
        view.log(f"test EM after: {last['eval/em']:.3f}")
        self.write_report()
        return 0

    def write_report(self) -> None:
        summary = summarize(self)

        json_path, md_path = write_report(summary, self.run_dir)
        before, after = summary.em_before, summary.em_after
        print(
            f"\nreport: {md_path}\nEM before {before:.3f} -> after {after:.3f} "
            f"(learner {summary.wall_s:.0f} s over {summary.segments} segment(s))"
        )

    def stop(self, interrupted: bool) -> None:
        # learner first (SIGINT: finish the step, checkpoint; a publish to a hung engine may take its whole
        # timeout first), then generators (release leases), then the rest, Redis last
        learner_grace = 60.0 + self.cfg.weight_sync.timeout_s
        self.supervisor.stop(
            ["learner", "generator", "retrieval", "redis"], grace_s={"learner": learner_grace}
        )
        if self.metrics is not None:
            self.metrics.close()
        if self.buffer is not None:
            self.buffer.close()
        if self.redis_server is not None:
            self.redis_server.stop()
        self.lock.release()
        if interrupted:
            print(f"\nstopped. resume with: {self.command} --resume {self.run_dir}")


def _interrupt_on_sigterm() -> None:
    """`kill` (SIGTERM) stops a run like Ctrl-C does: the children are stopped in order, never orphaned. Ctrl-C
    (SIGINT) does so even where the run inherited it ignored: a shell starts background commands (`nohup sr1 run &`)
    with SIGINT ignored, and Python then leaves it so."""
    import signal

    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def main(argv: list[str] | None = None) -> int:
    return run_main(parse_args(build_parser(), argv), Orchestrator)


def world_main(argv: list[str] | None = None) -> int:
    """`sr1 world`: build (or find cached) the embedded world a `sr1 run` with the same arguments would use."""
    args = parse_args(build_parser(prog="sr1 world", description=world_main.__doc__), argv)
    try:
        cfg, _ = _resolve(args)
    except ConfigError as err:
        print(f"sr1 world: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if cfg.model.path not in EMBEDDED_MODELS:
        print(f"sr1 world: model.path {cfg.model.path!r} is not embedded: nothing to build")
        return 0
    model_dir, _ = build_embedded(cfg.model.path, cfg.seed)
    print(f"sr1 world: {cfg.model.path} (seed {cfg.seed}) ready in {model_dir.parent}")
    return 0


def run_main(args: argparse.Namespace, orchestrator_class: type[Orchestrator], **options: Any) -> int:
    """Run an orchestrator (`sr1 run`'s, or `sr1 launch`'s with its `options`) and always stop it; the exit code."""
    command = orchestrator_class.command
    _interrupt_on_sigterm()
    try:
        cfg, run_dir = _resolve(args)
    except ConfigError as err:
        print(f"{command}: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    orchestrator = orchestrator_class(
        cfg,
        run_dir,
        resume=args.resume is not None,
        live=not args.no_live and sys.stdout.isatty(),
        startup_timeout_s=args.startup_timeout,
        **options,
    )
    interrupted = False
    try:
        return orchestrator.run()
    except KeyboardInterrupt:
        interrupted = True
        print(f"\n{command}: interrupted; stopping the parts (the learner checkpoints first)", flush=True)
        return 130
    except BadInput as err:
        print("\n".join(f"{command}: {problem}" for problem in err.problems), file=sys.stderr)
        return EXIT_BAD_INPUT
    except EvictingRedis as err:  # buffer.redis_url names a Redis that would drop the run's keys
        print(f"{command}: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (ChildFailed, TimeoutError, RunLocked) as err:
        print(f"{command}: {err}", file=sys.stderr)
        if getattr(err, "exit_code", None) == EXIT_BAD_INPUT:
            return EXIT_BAD_INPUT  # a part stopped on its configuration or data: going on would fail again
        interrupted = not isinstance(err, RunLocked)  # print how to go on
        # the learner's checkpoints cannot be written: its message says what space it needs; then --resume
        return EXIT_CHECKPOINT_FAILED if getattr(err, "exit_code", None) == EXIT_CHECKPOINT_FAILED else 1
    except REDIS_UNAVAILABLE as err:
        print(f"{command}: lost Redis for longer than buffer.reconnect_s ({err})", file=sys.stderr)
        interrupted = True
        return 1
    finally:
        orchestrator.stop(interrupted)


if __name__ == "__main__":
    sys.exit(main())
