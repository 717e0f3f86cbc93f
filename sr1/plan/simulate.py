"""The discrete-event core of `sr1 plan`: one pipeline (engines, searches, admission, batches, learner, weight sync)
simulated step by step.

    result = simulate(Pipeline(engines=4, ranks=4, groups_per_step=512, group_size=5, max_staleness=2, ...), profile)
    result.steps_per_hour, result.generator_busy, result.learner_busy, result.staleness_histogram

What is modelled:
- Engines with continuous batching as processor sharing: an engine batching n sequences produces
  `tokens_per_s(n)` tokens/s in all (the profile's curve), n sequences progressing at the same per-sequence rate; a
  turn's work is its sampled tokens plus `prefill_cost` times the tokens it prefills (the prompt on the first turn,
  the last observation on later ones: prefix caching keeps the rest). At most `max_num_seqs` sequences run; the rest
  wait in the engine's queue.
- A generator worker holds at most `max_inflight_groups` groups; all n samples of a group run on its engine. Released
  prompts go round the workers, the one that has waited longest first, each read taking at most
  `claim_batch_groups` and never more than the worker's free slots (as Redis serves the generators' blocking reads of
  one release script). Between turns a trajectory leaves the engine for a search round trip (lognormal latency);
  the number of searches is binomial over `max_turns` with the profile's mean, tokens per turn lognormal (capped by
  `max_tokens_per_turn`, and the whole response by `max_response_tokens`).
- Admission and batch assembly are sr1's own code, not a copy: the real `buffer.admission.PromptFeeder.pump` runs
  against an in-memory stand-in for the four buffer counters it reads, and batches are chosen by
  the assembler's own `buffer.admission.select_batch` (`admission.py`: `CountingBuffer`, `choose_batch`). Dynamic sampling drops a finished group with
  the profile's probability; the feeder then releases one more, as the real buffer's `dropped` counter makes it.
- Hand-offs: a released prompt reaches a worker's engine `handoff_s` later (the claim, the worker's wait for the
  published weights, and on the way back the group's put and the learner's take, lumped together).
- The retrieval server, when the profile has its curve (`retrieval.requests_per_s`, `bench_retrieval.py --curve`):
  searches in flight share its requests/s as sequences share an engine, and a search's round trip is its latency
  draw plus the delay the load adds (its time in the server less its time there alone). Without the curve searches
  never queue. A worker process's ceiling (`generator.worker_tokens_per_s`), when given, caps its engine's rate.
- The learner's step: the batch's trajectories cut into PPO mini-batches and each dealt to the ranks by tokens with
  the learner's own split; each update's most loaded rank, its model tokens x PPO epochs over (per-rank tokens/s x
  scaling efficiency), bounds the step, plus a fixed overhead; then the publish. Full weights pause every engine
  through it (`engine_pause_s`, its sequences frozen); a LoRA adapter loads beside the old one with no pause. Tokens
  sampled after the update carry the new version. On shared GPUs (an engine and a rank on each), the engines run at
  `shared_gpu_speed` while the learner trains, and the learner at it while any engine decodes; a checkpoint every `checkpoint_every` steps. Staleness is counted per sampled token:
  the version trained at minus the version of the weights that sampled it.

Not modelled: evaluations, engine or learner failures, prefix-cache misses, KV-cache preemption, and the learner's
batch forwarding between ranks.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import dataclass

import numpy as np

from buffer.admission import PromptFeeder
from learner.packing import split_across_ranks
from sr1.plan.admission import CountingBuffer, EndlessPrompts, choose_batch
from sr1.plan.pipeline import Pipeline
from sr1.plan.profile import Profile
from sr1.plan.servers import Engine, RetrievalServer, SharedLearner
from sr1.plan.trajectories import Group, Trajectory, Turn, draw_turns, lognormal, obs_tokens


@dataclass
class SimResult:
    """What one simulated run measured, over the steps after the warm-up."""

    steps: int
    seconds: float
    step_s: float
    steps_per_hour: float
    generator_busy: float  # mean over engines of the share of time with a trajectory in flight
    learner_busy: float  # share of the learner's time not spent waiting for a batch
    staleness_histogram: dict[int, int]  # sampled tokens trained, by staleness
    wait_s: float  # mean seconds per step the learner waited for its batch
    train_s: float  # mean seconds per step of training (publish and checkpoint included)
    worker_bound: float = 0.0  # mean over engines of the share of time they could outrun their worker
    retrieval_busy: float | None = (
        None  # share of time the retrieval server had a request (None: not modelled)
    )
    search_wait_s: float = 0.0  # mean seconds a search waited for the loaded retrieval server

    @property
    def staleness_mean(self) -> float:
        total = sum(self.staleness_histogram.values())
        return sum(k * v for k, v in self.staleness_histogram.items()) / total if total else 0.0


# -- the simulation --------------------------------------------------------------------------------------------------


class _Simulation:
    def __init__(self, pipe: Pipeline, profile: Profile, seed: int):
        self.pipe, self.profile = pipe, profile
        self.rng = np.random.default_rng(seed)
        self.engines = [Engine(i, profile.generator, pipe.max_num_seqs) for i in range(pipe.engines)]
        self.retrieval = RetrievalServer(profile.retrieval.requests_per_s) if profile.retrieval else None
        self.search_waits: list[float] = []  # seconds each search waited for the loaded retrieval server
        self.events: list[tuple[float, int, str, object]] = []
        self.counter = itertools.count()
        self.now = 0.0
        self.buffer = CountingBuffer()
        self.feeder = PromptFeeder(
            self.buffer,
            EndlessPrompts(),
            groups_per_step=pipe.groups_per_step,
            max_staleness=pipe.max_staleness,
        )
        self.pending: deque[Group] = deque()  # released, not claimed by a worker
        # workers waiting in their claim, first come first served: Redis hands a release (one script, every prompt at
        # once) to the client blocked longest, which reads up to claim_batch_groups and queues again behind the others
        self.claim_order: deque[Engine] = deque(self.engines)
        self.unconsumed: dict[str, int] = {}  # released, not trained or dropped: group id -> release version
        self.finished: dict[str, Group] = {}  # finished, not trained, in finishing (stream) order
        self.learner_idle_since: float | None = 0.0
        self.version = 0
        self.step_log: list[tuple[float, float, float]] = []  # (end time, wait s, busy s) per step
        self.histogram: dict[int, int] = {}
        self.shared: SharedLearner | None = None  # a step training on GPUs shared with the engines

    # events
    def at(self, time: float, kind: str, payload: object = None) -> None:
        heapq.heappush(self.events, (time, next(self.counter), kind, payload))

    def reschedule(self, engine: Engine) -> None:
        engine.epoch += 1
        when = engine.next_completion()
        if when is not None:
            self.at(when, "turn_done", (engine.index, engine.epoch))
        if self.shared is not None:  # the learner beside it slows while any engine decodes
            decoding = any(e.running and not e.paused for e in self.engines)
            if self.shared.set_rate(self.now, self.profile.shared_gpu_speed.value if decoding else 1.0):
                self.at(self.shared.finish(), "trained", (self.shared, self.shared.epoch))

    # admission, claims
    def pump(self) -> None:
        self.buffer.current_version = self.version
        before = len(self.buffer.released)
        self.feeder.pump()
        released = []
        for prompt in self.buffer.released[before:]:
            group = Group(prompt.group_id, prompt.release_version, self.pipe.group_size)
            self.unconsumed[group.group_id] = group.release_version
            released.append(group)
        handoff = self.profile.handoff_s.value
        if handoff > 0 and released:
            self.at(self.now + handoff, "claimable", released)
        else:
            self.on_claimable(released)

    def on_claimable(self, groups: list[Group]) -> None:
        self.pending.extend(groups)
        self.claim()

    def claim(self) -> None:
        """Released groups go round the workers, the one that has waited longest first, each read taking at most
        `claim_batch_groups` and never more than the worker's free slots (as `ReplayBuffer.claim_prompts` serves
        the generators' blocking reads), until none is left or every worker is full."""
        touched: dict[int, Engine] = {}
        while self.pending:
            took = False
            for _ in range(len(self.claim_order)):
                if not self.pending:
                    break
                engine = self.claim_order.popleft()
                self.claim_order.append(engine)
                free = min(self.pipe.max_inflight_groups - engine.groups_held, self.pipe.claim_batch_groups)
                if free <= 0:
                    continue
                if engine.index not in touched:
                    engine.advance(self.now)
                    touched[engine.index] = engine
                for _ in range(min(free, len(self.pending))):
                    self.start_group(engine, self.pending.popleft())
                took = True
            if not took:
                break
        for engine in touched.values():
            self.reschedule(engine)

    def start_group(self, engine: Engine, group: Group) -> None:
        group.engine = engine.index
        engine.groups_held += 1
        for _ in range(self.pipe.group_size):
            turns = draw_turns(self.rng, self.pipe, self.profile)
            trajectory = Trajectory(group, turns, obs_tokens(self.pipe, self.profile))
            prompt = round(self.profile.workload.prompt_tokens.value)
            group.trajectory_tokens.append(prompt + sum(turns) + trajectory.obs_tokens * (len(turns) - 1))
            engine.inflight += 1
            self.submit_turn(engine, trajectory, prefill=prompt)

    def submit_turn(self, engine: Engine, trajectory: Trajectory, prefill: int) -> None:
        decode = trajectory.turns[trajectory.turn]
        turn = Turn(trajectory, decode, prefill * self.profile.generator.prefill_cost.value)
        engine.submit(turn, turn.prefill_work + turn.decode)

    # generators
    def on_turn_done(self, engine_index: int, epoch: int) -> None:
        engine = self.engines[engine_index]
        if epoch != engine.epoch:
            return  # superseded by a later change of this engine
        engine.advance(self.now)
        turn = engine.pop_finished()
        engine.credit(turn, turn.decode)
        trajectory = turn.trajectory
        trajectory.turn += 1
        if trajectory.turn < len(trajectory.turns):
            latency = lognormal(
                self.rng,
                self.profile.workload.search_latency_s.value,
                self.profile.workload.search_latency_cv.value,
            )
            if self.retrieval is None:
                self.at(self.now + latency, "search_done", trajectory)
            else:
                trajectory.search_started, trajectory.search_latency = self.now, latency
                self.retrieval.advance(self.now)
                self.retrieval.submit(trajectory, 1.0)
                self.reschedule_retrieval()
        else:
            engine.inflight -= 1
            group = trajectory.group
            group.left -= 1
            if group.left == 0:
                self.group_done(engine, group)
        self.reschedule(engine)

    def reschedule_retrieval(self) -> None:
        self.retrieval.epoch += 1
        when = self.retrieval.next_completion()
        if when is not None:
            self.at(when, "search_served", self.retrieval.epoch)

    def on_search_served(self, epoch: int) -> None:
        """A search leaves the retrieval server: its round trip is its latency plus the wait the load added (at
        least its time in the server)."""
        if epoch != self.retrieval.epoch:
            return  # superseded: a search arrived or left since
        self.retrieval.advance(self.now)
        trajectory = self.retrieval.pop_finished()
        in_server = self.now - trajectory.search_started
        wait = max(in_server - self.retrieval.alone_s, 0.0)
        self.search_waits.append(wait)
        done = max(trajectory.search_started + trajectory.search_latency + wait, self.now)
        self.at(done, "search_done", trajectory)
        self.reschedule_retrieval()

    def on_search_done(self, trajectory: Trajectory) -> None:
        engine = self.engines[trajectory.group.engine]
        engine.advance(self.now)
        self.submit_turn(engine, trajectory, prefill=trajectory.obs_tokens)
        self.reschedule(engine)

    def group_done(self, engine: Engine, group: Group) -> None:
        engine.groups_held -= 1
        dropped = self.pipe.dynamic_sampling and self.rng.random() < (
            self.profile.workload.dropped_group_fraction.value
        )
        if dropped:  # as the assembler's filter does: gone from the in-flight set, one more prompt released
            del self.unconsumed[group.group_id]
            self.buffer.dropped += 1
            self.pump()
        else:
            self.finished[group.group_id] = group
        self.claim()
        self.try_step()

    # the learner
    def try_step(self) -> None:
        if self.learner_idle_since is None or len(self.finished) < self.pipe.groups_per_step:
            return
        if not self.stragglers_done():
            return  # the hard bound needs a group still generating: select_batch would say so, at a higher cost
        batch = choose_batch(self.version, list(self.finished.values()), self.unconsumed, self.pipe)
        if batch is None:
            return
        for group in batch:
            del self.finished[group.group_id]
            del self.unconsumed[group.group_id]
            for version, tokens in group.tokens_by_version.items():
                staleness = self.version - version
                self.histogram[staleness] = self.histogram.get(staleness, 0) + tokens
        wait = self.now - self.learner_idle_since
        self.learner_idle_since = None
        learner = self.profile.learner
        efficiency = learner.scaling_efficiency.value if self.pipe.ranks > 1 else 1.0
        tokens = [t for group in batch for t in group.trajectory_tokens]
        slowest = slowest_rank_tokens(tokens, self.pipe.ranks, self.pipe.ppo_mini_batch_size)
        train = slowest * self.pipe.ppo_epochs / (learner.tokens_per_s_per_rank.value * efficiency)
        train += learner.step_overhead_s.value
        if not self.pipe.shared_gpu:
            self.trained(train, wait, self.now - wait)
            return
        # an engine and a rank on each GPU, time-sliced: each at its share while both work
        self.shared = SharedLearner(train, self.now, wait, self.now - wait)
        for engine in self.engines:
            engine.advance(self.now)
            engine.speed = self.profile.shared_gpu_speed.value
            self.reschedule(engine)

    def on_trained(self, job: SharedLearner, epoch: int) -> None:
        if job is self.shared and epoch == job.epoch:  # not an earlier finish time, nor an earlier step's
            shared, self.shared = self.shared, None
            self.trained(0.0, shared.wait, shared.started)

    def trained(self, delay: float, wait: float, started: float) -> None:
        """The step's training ends `delay` from now: then the publish, and a checkpoint when one is due."""
        publish, due = self.profile.weight_sync_s.value, (self.version + 1) % self.pipe.checkpoint_every == 0
        checkpoint = self.profile.learner.checkpoint_s.value if due else 0.0
        self.at(self.now + delay, "publish")
        self.at(self.now + delay + publish, "published", None)
        self.at(self.now + delay + publish + checkpoint, "step_done", (wait, started))

    def stragglers_done(self) -> bool:
        """Whether every group whose deadline is this step has finished (quota j = 0)."""
        due = self.feeder.schedule.deadline
        required = sum(1 for rv in self.unconsumed.values() if due(rv) <= self.version)
        return required <= sum(1 for g in self.finished.values() if due(g.release_version) <= self.version)

    @property
    def engine_pause_s(self) -> float:
        """Seconds each update stops the engines: the whole publish for full weights, 0 for a LoRA adapter."""
        pause = self.profile.engine_pause_s or self.profile.weight_sync_s
        return min(pause.value, self.profile.weight_sync_s.value)

    def on_publish(self) -> None:
        pause = self.engine_pause_s
        for engine in self.engines:
            engine.advance(self.now)
            engine.speed = 1.0  # the learner's GPU work is done
            if pause > 0:  # full weights: loaded in place, sequences frozen until then
                engine.change_version(self.version + 1)
                engine.paused = True
            self.reschedule(engine)
        if pause > 0:
            self.at(self.now + pause, "resumed")

    def on_resumed(self) -> None:
        for engine in self.engines:
            engine.advance(self.now)
            engine.paused = False
            self.reschedule(engine)

    def on_published(self) -> None:
        if self.engine_pause_s > 0:
            return
        for engine in self.engines:  # a LoRA adapter: new tokens sample under it once it is loaded, no pause
            engine.advance(self.now)
            engine.change_version(self.version + 1)
            self.reschedule(engine)

    def on_step_done(self, wait: float, started: float) -> None:
        self.version += 1
        self.step_log.append((self.now, wait, self.now - started - wait))
        self.learner_idle_since = self.now
        self.pump()  # the feeder pumps as the learner asks for its next batch
        self.try_step()

    def run(self, steps: int, warmup: int) -> SimResult:
        self.pump()
        handlers = {
            "turn_done": lambda p: self.on_turn_done(*p),
            "search_done": self.on_search_done,
            "search_served": self.on_search_served,
            "claimable": self.on_claimable,
            "publish": lambda p: self.on_publish(),
            "published": lambda p: self.on_published(),
            "resumed": lambda p: self.on_resumed(),
            "trained": lambda p: self.on_trained(*p),
            "step_done": lambda p: self.on_step_done(*p),
        }
        busy_at_warm: list[float] = []
        bound_at_warm: list[float] = []
        retrieval_at_warm = 0.0
        warm_time = 0.0
        while self.version < steps:
            if not self.events:
                raise RuntimeError(
                    f"simulation stalled at version {self.version}: nothing in flight (a bug in the plan)"
                )
            self.now, _, kind, payload = heapq.heappop(self.events)
            handlers[kind](payload)
            if kind == "step_done" and self.version == warmup:
                warm_time = self.now
                for engine in self.engines:
                    engine.advance(self.now)
                busy_at_warm = [e.busy_s for e in self.engines]
                bound_at_warm = [e.worker_bound_s for e in self.engines]
                if self.retrieval is not None:
                    self.retrieval.advance(self.now)
                    retrieval_at_warm = self.retrieval.busy_s
                self.histogram = {}  # count the steps after the warm-up only
                self.search_waits = []
        for engine in self.engines:
            engine.advance(self.now)
        if self.retrieval is not None:
            self.retrieval.advance(self.now)
        measured = self.step_log[warmup:]
        seconds = self.now - warm_time
        return SimResult(
            steps=len(measured),
            seconds=seconds,
            step_s=seconds / len(measured),
            steps_per_hour=3600.0 * len(measured) / seconds,
            generator_busy=float(
                np.mean([(e.busy_s - b) / seconds for e, b in zip(self.engines, busy_at_warm, strict=True)])
            ),
            learner_busy=1.0 - sum(w for _, w, _ in measured) / seconds,
            staleness_histogram=dict(sorted(self.histogram.items())),
            wait_s=float(np.mean([w for _, w, _ in measured])),
            train_s=float(np.mean([b for _, _, b in measured])),
            worker_bound=float(
                np.mean(
                    [
                        (e.worker_bound_s - b) / seconds
                        for e, b in zip(self.engines, bound_at_warm, strict=True)
                    ]
                )
            ),
            retrieval_busy=None
            if self.retrieval is None
            else (self.retrieval.busy_s - retrieval_at_warm) / seconds,
            search_wait_s=float(np.mean(self.search_waits)) if self.search_waits else 0.0,
        )


def slowest_rank_tokens(trajectory_tokens: list[int], ranks: int, mini_batch_size: int | None) -> int:
    """The model tokens the learner's step waits for: the batch's trajectories (in group order) cut into PPO
    mini-batches of `mini_batch_size` (None: one), each dealt to the ranks by the learner's own split
    (`learner.packing.split_across_ranks`); every update waits for its most loaded rank."""
    size = mini_batch_size or len(trajectory_tokens) or 1
    slowest = 0
    for start in range(0, len(trajectory_tokens), size):
        mini = trajectory_tokens[start : start + size]
        slowest += max(sum(mini[i] for i in share) for share in split_across_ranks(mini, ranks))
    return slowest


def simulate(
    pipe: Pipeline, profile: Profile, *, steps: int = 12, warmup: int = 2, seed: int = 0
) -> SimResult:
    """Simulate learner steps of `pipe` with `profile`'s figures and measure the ones after `warmup`: at least
    `steps - warmup` of them, rounded up to whole cycles of max_staleness + 1 steps (an asynchronous pipeline can
    run in bursts of that period: the window must not start in one phase and end in another)."""
    if steps <= warmup:
        raise ValueError(f"steps ({steps}) must exceed warmup ({warmup})")
    if pipe.engines < 1 or pipe.ranks < 1:
        raise ValueError(
            f"a pipeline needs at least one engine and one rank, got {pipe.engines} and {pipe.ranks}"
        )
    cycle = pipe.max_staleness + 1
    measured = -(-(steps - warmup) // cycle) * cycle
    return _Simulation(pipe, profile, seed).run(warmup + measured, warmup)
