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
  against an in-memory stand-in for the four buffer counters it reads (`_CountingBuffer`), and batches are chosen by
  `BatchAssembler._select` (see `_choose_batch`, the one thin adapter). Dynamic sampling drops a finished group with
  the profile's probability; the feeder then releases one more, as the real buffer's `dropped` counter makes it.
- Hand-offs: a released prompt reaches a worker's engine `handoff_s` later (the claim, the worker's wait for the
  published weights, and on the way back the group's put and the learner's take, lumped together).
- The learner's step: model tokens x PPO epochs over (ranks x per-rank tokens/s x scaling efficiency), plus a fixed
  overhead; then the publish, during which every engine is paused (its sequences frozen) and after which their new
  tokens carry the new version; a checkpoint every `checkpoint_every` steps. Staleness is counted per sampled token:
  the version trained at minus the version of the weights that sampled it.

Not modelled: evaluations, engine or learner failures, retrieval-server saturation (latency does not grow with
load), prefix-cache misses, KV-cache preemption, and the learner's batch forwarding between ranks.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np

from buffer.admission import BatchAssembler, PromptFeeder, StalenessSchedule
from buffer.records import PromptRecord
from sr1.plan.profile import Profile


@dataclass(frozen=True)
class Pipeline:
    """One configuration to simulate: the split, the step's shape and the bound."""

    engines: int
    ranks: int
    groups_per_step: int
    group_size: int
    max_staleness: int
    max_turns: int = 4
    max_tokens_per_turn: int = 500
    max_obs_tokens: int = 500
    max_response_tokens: int = 4096
    max_inflight_groups: int = 128
    # most groups one claim reads; 1 deals a batch evenly over the engines, as veRL's rollout workers share it
    claim_batch_groups: int = 16
    max_num_seqs: int = 512
    ppo_epochs: int = 1
    checkpoint_every: int = 10**9
    dynamic_sampling: bool = False


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

    @property
    def staleness_mean(self) -> float:
        total = sum(self.staleness_histogram.values())
        return sum(k * v for k, v in self.staleness_histogram.items()) / total if total else 0.0


# -- trajectories ----------------------------------------------------------------------------------------------------


@dataclass
class _Group:
    group_id: str
    release_version: int
    left: int  # trajectories not finished
    engine: int = -1
    model_tokens: int = 0  # prompt + response tokens of its trajectories
    tokens_by_version: dict[int, int] = field(
        default_factory=dict
    )  # sampled tokens by the version that sampled them


@dataclass
class _Trajectory:
    group: _Group
    turns: list[int]  # sampled tokens of each turn; a search follows every turn but the last
    obs_tokens: int
    turn: int = 0


@dataclass
class _Turn:
    trajectory: _Trajectory
    decode: int
    prefill_work: float
    start_v: float = 0.0
    attributed: int = 0  # sampled tokens already credited to a version


def _lognormal(rng: np.random.Generator, mean: float, cv: float) -> float:
    if cv <= 0 or mean <= 0:
        return mean
    sigma2 = math.log1p(cv * cv)
    return float(rng.lognormal(math.log(mean) - sigma2 / 2, math.sqrt(sigma2)))


def _draw_turns(rng: np.random.Generator, pipe: Pipeline, profile: Profile) -> list[int]:
    w = profile.workload
    searches = 0
    if w.searches_per_trajectory.value > 0:
        p = min(w.searches_per_trajectory.value / pipe.max_turns, 1.0)
        searches = int(rng.binomial(pipe.max_turns, p))
    turns, budget = [], pipe.max_response_tokens
    for i in range(searches + 1):
        tokens = round(_lognormal(rng, w.tokens_per_turn.value, w.tokens_per_turn_cv.value))
        tokens = max(1, min(tokens, pipe.max_tokens_per_turn, budget))
        turns.append(tokens)
        budget -= tokens + (_obs_tokens(pipe, profile) if i < searches else 0)
        if budget <= 0:
            break  # the token budget ends the trajectory
    return turns


def _obs_tokens(pipe: Pipeline, profile: Profile) -> int:
    return round(min(profile.workload.obs_tokens_per_search.value, pipe.max_obs_tokens))


# -- admission and batch assembly: sr1's own code ------------------------------------------------------------------


class _Prompts(Sequence):
    """An endless prompt dataset for the real PromptFeeder."""

    def __len__(self) -> int:
        return 10**12

    def __getitem__(self, i):
        return PromptRecord(f"plan/train/{i}/e0", "", [], [], "plan", i)


class _CountingBuffer:
    """The buffer operations `PromptFeeder.pump` calls, kept in memory (no Redis in a simulation)."""

    def __init__(self) -> None:
        self.current_version = 0
        self.dropped = 0
        self.released: list[PromptRecord] = []

    def version(self) -> int:
        return self.current_version

    def replaced_count(self) -> int:
        """Groups that left without being trained (here: dropped by dynamic sampling; nothing is dead-lettered in a
        simulation), each leaving room for one more release."""
        return self.dropped

    def released_count(self) -> int:
        return len(self.released)

    def release_prompts(self, prompts: list[PromptRecord]) -> list[PromptRecord]:
        self.released += prompts
        return prompts

    def release_pause_reason(self) -> None:
        """No Redis memory to run out of in a simulation: releases never pause for it."""
        return None


@dataclass
class _Taken:
    entry_id: str
    group: _Group


def _choose_batch(
    version: int, held: list[_Group], unconsumed: dict[str, int], pipe: Pipeline
) -> list | None:
    """The batch for `version`, chosen by `BatchAssembler._select` itself (thin adapter: `_select` reads only
    `_held`, `schedule` and `groups_per_step` of its assembler, none of the Redis state)."""
    assembler = SimpleNamespace(
        _held={g.group_id: _Taken(g.group_id, g) for g in held},
        schedule=StalenessSchedule(pipe.max_staleness),
        groups_per_step=pipe.groups_per_step,
    )
    chosen = BatchAssembler._select(assembler, version, unconsumed)
    return None if chosen is None else [t.group for t in chosen]


# -- the engines -----------------------------------------------------------------------------------------------------


class _Engine:
    """One engine under processor sharing: `v` is the work each running sequence has received so far."""

    def __init__(self, index: int, pipe: Pipeline, profile: Profile):
        self.index, self.pipe, self.profile = index, pipe, profile
        self.running: dict[int, _Turn] = {}
        self.finish_heap: list[tuple[float, int]] = []
        self.queue: deque[_Turn] = deque()
        self.v = 0.0
        self.t = 0.0
        self.paused = False
        self.epoch = 0  # bumps whenever the next completion time may change
        self.version = 0
        self.groups_held = 0
        self.inflight = 0  # trajectories of this worker in flight (engine or search)
        self.busy_s = 0.0
        self.ids = itertools.count()

    def rate(self) -> float:
        n = len(self.running)
        if n == 0 or self.paused:
            return 0.0
        return self.profile.generator.tokens_per_s.tokens_per_s(n) / n

    def advance(self, now: float) -> None:
        self.v += (now - self.t) * self.rate()
        if self.inflight > 0:
            self.busy_s += now - self.t
        self.t = now

    def next_completion(self) -> float | None:
        rate = self.rate()
        if rate <= 0 or not self.finish_heap:
            return None
        return self.t + max(self.finish_heap[0][0] - self.v, 0.0) / rate

    def submit(self, turn: _Turn) -> None:
        if len(self.running) < self.pipe.max_num_seqs:
            self._start(turn)
        else:
            self.queue.append(turn)

    def _start(self, turn: _Turn) -> None:
        key = next(self.ids)
        turn.start_v = self.v
        self.running[key] = turn
        heapq.heappush(self.finish_heap, (self.v + turn.prefill_work + turn.decode, key))

    def pop_finished(self) -> _Turn:
        _, key = heapq.heappop(self.finish_heap)
        turn = self.running.pop(key)
        if self.queue:
            self._start(self.queue.popleft())
        return turn

    def credit(self, turn: _Turn, upto: int) -> None:
        """Credit the turn's sampled tokens up to `upto` to the engine's current version."""
        tokens = upto - turn.attributed
        if tokens > 0:
            by_version = turn.trajectory.group.tokens_by_version
            by_version[self.version] = by_version.get(self.version, 0) + tokens
            turn.attributed = upto

    def change_version(self, version: int) -> None:
        """New weights: the tokens sampled so far by running turns belong to the old version."""
        for turn in self.running.values():
            done = int(min(max(self.v - turn.start_v - turn.prefill_work, 0.0), turn.decode))
            self.credit(turn, done)
        self.version = version


# -- the simulation --------------------------------------------------------------------------------------------------


class _Simulation:
    def __init__(self, pipe: Pipeline, profile: Profile, seed: int):
        self.pipe, self.profile = pipe, profile
        self.rng = np.random.default_rng(seed)
        self.engines = [_Engine(i, pipe, profile) for i in range(pipe.engines)]
        self.events: list[tuple[float, int, str, object]] = []
        self.counter = itertools.count()
        self.now = 0.0
        self.buffer = _CountingBuffer()
        self.feeder = PromptFeeder(
            self.buffer, _Prompts(), groups_per_step=pipe.groups_per_step, max_staleness=pipe.max_staleness
        )
        self.pending: deque[_Group] = deque()  # released, not claimed by a worker
        # workers waiting in their claim, first come first served: Redis hands a release (one script, every prompt at
        # once) to the client blocked longest, which reads up to claim_batch_groups and queues again behind the others
        self.claim_order: deque[_Engine] = deque(self.engines)
        self.unconsumed: dict[str, int] = {}  # released, not trained or dropped: group id -> release version
        self.finished: dict[str, _Group] = {}  # finished, not trained, in finishing (stream) order
        self.learner_idle_since: float | None = 0.0
        self.version = 0
        self.step_log: list[tuple[float, float, float]] = []  # (end time, wait s, busy s) per step
        self.histogram: dict[int, int] = {}

    # events
    def at(self, time: float, kind: str, payload: object = None) -> None:
        heapq.heappush(self.events, (time, next(self.counter), kind, payload))

    def reschedule(self, engine: _Engine) -> None:
        engine.epoch += 1
        when = engine.next_completion()
        if when is not None:
            self.at(when, "turn_done", (engine.index, engine.epoch))

    # admission, claims
    def pump(self) -> None:
        self.buffer.current_version = self.version
        before = len(self.buffer.released)
        self.feeder.pump()
        released = []
        for prompt in self.buffer.released[before:]:
            group = _Group(prompt.group_id, prompt.release_version, self.pipe.group_size)
            self.unconsumed[group.group_id] = group.release_version
            released.append(group)
        handoff = self.profile.handoff_s.value
        if handoff > 0 and released:
            self.at(self.now + handoff, "claimable", released)
        else:
            self.on_claimable(released)

    def on_claimable(self, groups: list[_Group]) -> None:
        self.pending.extend(groups)
        self.claim()

    def claim(self) -> None:
        """Released groups go round the workers, the one that has waited longest first, each read taking at most
        `claim_batch_groups` and never more than the worker's free slots (as `ReplayBuffer.claim_prompts` serves
        the generators' blocking reads), until none is left or every worker is full."""
        touched: dict[int, _Engine] = {}
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

    def start_group(self, engine: _Engine, group: _Group) -> None:
        group.engine = engine.index
        engine.groups_held += 1
        for _ in range(self.pipe.group_size):
            turns = _draw_turns(self.rng, self.pipe, self.profile)
            trajectory = _Trajectory(group, turns, _obs_tokens(self.pipe, self.profile))
            prompt = round(self.profile.workload.prompt_tokens.value)
            group.model_tokens += prompt + sum(turns) + trajectory.obs_tokens * (len(turns) - 1)
            engine.inflight += 1
            self.submit_turn(engine, trajectory, prefill=prompt)

    def submit_turn(self, engine: _Engine, trajectory: _Trajectory, prefill: int) -> None:
        decode = trajectory.turns[trajectory.turn]
        engine.submit(_Turn(trajectory, decode, prefill * self.profile.generator.prefill_cost.value))

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
            latency = _lognormal(
                self.rng,
                self.profile.workload.search_latency_s.value,
                self.profile.workload.search_latency_cv.value,
            )
            self.at(self.now + latency, "search_done", trajectory)
        else:
            engine.inflight -= 1
            group = trajectory.group
            group.left -= 1
            if group.left == 0:
                self.group_done(engine, group)
        self.reschedule(engine)

    def on_search_done(self, trajectory: _Trajectory) -> None:
        engine = self.engines[trajectory.group.engine]
        engine.advance(self.now)
        self.submit_turn(engine, trajectory, prefill=trajectory.obs_tokens)
        self.reschedule(engine)

    def group_done(self, engine: _Engine, group: _Group) -> None:
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
            return  # the hard bound needs a group still generating: _select would say so, at a higher cost
        batch = _choose_batch(self.version, list(self.finished.values()), self.unconsumed, self.pipe)
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
        tokens = sum(g.model_tokens for g in batch) * self.pipe.ppo_epochs
        train = tokens / (learner.tokens_per_s_per_rank.value * self.pipe.ranks * efficiency)
        train += learner.step_overhead_s.value
        publish = self.profile.weight_sync_s.value
        checkpoint = (
            learner.checkpoint_s.value if (self.version + 1) % self.pipe.checkpoint_every == 0 else 0.0
        )
        self.at(self.now + train, "publish")
        self.at(self.now + train + publish, "published", None)
        self.at(self.now + train + publish + checkpoint, "step_done", (wait, self.now - wait))

    def stragglers_done(self) -> bool:
        """Whether every group released at version <= version - max_staleness has finished (quota j = 0)."""
        threshold = self.version - self.pipe.max_staleness
        required = sum(1 for rv in self.unconsumed.values() if rv <= threshold)
        return required <= sum(1 for g in self.finished.values() if g.release_version <= threshold)

    def on_publish(self) -> None:
        for engine in self.engines:
            engine.advance(self.now)
            engine.change_version(self.version + 1)
            engine.paused = True
            self.reschedule(engine)

    def on_published(self) -> None:
        for engine in self.engines:
            engine.advance(self.now)
            engine.paused = False
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
            "claimable": self.on_claimable,
            "publish": lambda p: self.on_publish(),
            "published": lambda p: self.on_published(),
            "step_done": lambda p: self.on_step_done(*p),
        }
        busy_at_warm: list[float] = []
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
                self.histogram = {}  # count the steps after the warm-up only
        for engine in self.engines:
            engine.advance(self.now)
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
        )


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
