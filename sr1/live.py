"""The live terminal view of `sr1 run`: one table refreshed every second (plain log lines without a TTY)."""

from __future__ import annotations

import time
from typing import Any

from buffer.monitor import memory_text, staleness_histogram
from common.progress import PhaseProgress, format_seconds
from sr1.report import engine_update_figures, read_metric_lines

# without a terminal, a status line this often: the run's loop refreshes about once a second, so no two lines are
# more than about 10 s apart (no phase silent longer)
PLAIN_EVERY_S = 8.5


def _num(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def histogram_shares(histogram: dict[int, int]) -> str | None:
    """`0:4% 1:10% 2:86%`: the share of trained tokens at each staleness (None before any)."""
    total = sum(histogram.values())
    if not total:
        return None
    return " ".join(f"{k}:{100 * v / total:.0f}%" for k, v in sorted(histogram.items()))


def paused_reason(generator_metrics: list[dict[str, Any]]) -> str | None:
    """Which generators paused sampling for tool errors and why (None when none did)."""
    reasons = [m.get("rollout/pause_reason") for m in generator_metrics if m.get("rollout/state") == "paused"]
    if not reasons:
        return None
    return f"{len(reasons)} of {len(generator_metrics)} generator(s): {reasons[0]}"


def checkpoint_state(metrics: dict[str, Any]) -> str | None:
    """`step 8` (the last good checkpoint), and how many saves failed since (None before the first row)."""
    if "checkpoint/last_good_step" not in metrics:
        return None
    text = f"step {metrics['checkpoint/last_good_step']:.0f}"
    failed = int(metrics.get("checkpoint/failed_in_a_row", 0))
    return text + (f"; {failed} failed since (logs/learner.log says why)" if failed else "")


def engine_updates(generator_metrics: list[dict[str, Any]]) -> str | None:
    """`pause 0.000s median, 0.000s max; probe 0.0003`, led by `ADAPTER MISMATCH (n)` when an engine was found
    sampling from another policy than the version it loaded (None before any update)."""
    figures = engine_update_figures(generator_metrics)
    if not figures:
        return None
    text = (
        f"pause {figures['pause_s_p50']:.3f}s median, {figures['pause_s_max']:.3f}s max; "
        f"probe {figures['probe_diff']:.4f}"
    )
    mismatches = figures["adapter_mismatches"]
    return f"ADAPTER MISMATCH ({mismatches}); {text}" if mismatches else text


class LiveView:
    def __init__(self, orchestrator, *, enabled: bool):
        self.orch = orchestrator
        self.enabled = enabled
        self._live = None
        self._last_plain = 0.0
        self._metrics_offset = 0
        self.last_metrics: dict[str, Any] = {}
        self._first_step: tuple[float, int] | None = (
            None  # (when, step) of the first step seen: the rate's origin
        )

    def log(self, message: str) -> None:
        elapsed = time.monotonic() - self.orch.started
        line = f"[{elapsed:6.0f}s] {message}"
        if self._live is not None:
            self._live.console.print(line)
        else:
            print(line, flush=True)

    def phase(self, name: str, *, expected_s: float | None = None, total: int | None = None, unit: str = ""):
        """Progress of a phase before the live table starts (engines starting, an evaluation): a bar in a terminal,
        a line every 10 s without one, each with about how long is left."""
        return PhaseProgress(
            name, total=total, unit=unit, expected_s=expected_s, terminal=self.enabled, printer=self.log
        )

    def __enter__(self) -> LiveView:
        if self.enabled:
            from rich.live import Live

            self._live = Live(self._table(), refresh_per_second=2, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)
            self._live = None

    def _read_new_metrics(self) -> None:
        """Keep the learner's last metrics row, reading only what metrics.jsonl gained since the last call."""
        path = self.orch.run_dir / "metrics.jsonl"
        try:
            with open(path, "rb") as f:
                f.seek(self._metrics_offset)
                chunk = f.read()
        except OSError:
            return
        complete = chunk[: chunk.rfind(b"\n") + 1]  # a half-written last line waits for the next call
        self._metrics_offset += len(complete)
        rows = read_metric_lines(complete.decode(errors="replace").splitlines())
        steps = [r for r in rows if "step" in r]  # a segment marker is not a step
        if steps:
            self.last_metrics = steps[-1]

    def training_left_s(self, step: int | None, total: int, now: float | None = None) -> float | None:
        """Seconds of training left at the rate of the steps seen so far (None before two steps were seen)."""
        now = time.monotonic() if now is None else now
        if step is None:
            return None
        if self._first_step is None:
            self._first_step = (now, step)
            return None
        since, first = self._first_step
        if step <= first or now <= since:
            return None
        return (total - step) * (now - since) / (step - first)

    def snapshot(self) -> dict[str, Any]:
        """The figures shown: learner metrics (last step), buffer stats, generator heartbeats, last eval."""
        self._read_new_metrics()
        m = self.last_metrics
        total = self.orch.cfg.learner.total_steps
        left = self.training_left_s(m.get("step"), total)
        stats = self.orch.buffer.stats()
        generators = [w for w in self.orch.buffer.workers() if w.get("role") == "generator"]
        gen_metrics = [w.get("metrics", {}) for w in generators]
        last_eval = self.orch.evals[-1] if self.orch.evals else {}
        return {
            "step": f"{m.get('step', 0)}/{total}",
            "training left": "-" if left is None else f"about {format_seconds(left)}",
            "version": stats.get("buffer/version"),
            "reward": m.get("batch/reward_mean"),
            "test EM": last_eval.get("eval/em"),
            "generating / queued / trained (unacked)": "{} / {} / {}".format(
                stats.get("buffer/generating_groups"),
                stats.get("buffer/queued_groups"),
                stats.get("buffer/trained_unacked"),
            ),
            "staleness mean/max (bound)": f"{_num(m.get('staleness/mean'))} / {_num(m.get('staleness/max'), 0)} "
            f"({_num(m.get('staleness/bound'), 0)}; next releases {_num(stats.get('buffer/staleness_bound'), 0)})",
            "off-policy KL / mismatch KL / IS ESS": f"{_num(m.get('loss/offpolicy_kl'), 4)} / "
            f"{_num(m.get('loss/mismatch_kl'), 4)} / {_num(m.get('loss/is_ess'), 3)}",
            "clipped / masked tokens": f"{_num(m.get('loss/clipped_frac'), 3)} / {_num(m.get('loss/masked_frac'), 3)}",
            "staleness of trained tokens": histogram_shares(staleness_histogram(stats)),
            "gen tokens/s": sum(g.get("rollout/tokens_per_s", 0.0) for g in gen_metrics)
            if gen_metrics
            else None,
            "learner tokens/s": m.get("perf/tokens_per_s"),
            "tool calls/traj": m.get("batch/tool_calls_per_traj"),
            "tool errors (step) / latency": f"{_num(m.get('tools/errors'), 0)} / {_num(m.get('tools/latency_s'))}s",
            "dead letters (poison/failed/malformed/untrainable)": "{} ({}/{}/{}/{})".format(
                stats.get("buffer/dead_letters"),
                stats.get("buffer/poison_prompts"),
                stats.get("buffer/failed_prompts"),
                stats.get("buffer/malformed"),
                stats.get("buffer/untrainable"),
            ),
            "redis memory (used / max)": memory_text(stats),
            "checkpoint": checkpoint_state(m),
            "generators": len(generators),
            "paused": paused_reason(gen_metrics),
            "engine update pause / probe": engine_updates(gen_metrics),
            "elapsed": f"{time.monotonic() - self.orch.started:.0f}s",
        }

    def _table(self):
        from rich.table import Table

        table = Table(title="sr1 run", show_header=False, expand=False)
        table.add_column("what", style="bold cyan")
        table.add_column("value", justify="right")
        try:
            snap = self.snapshot()
        except Exception as err:  # a transient Redis hiccup must not kill the run's view
            snap = {"status": f"waiting ({type(err).__name__})"}
        for key, value in snap.items():
            table.add_row(key, _num(value))
        return table

    def refresh(self) -> None:
        if self._live is not None:
            self._live.update(self._table())
        elif time.monotonic() - self._last_plain >= PLAIN_EVERY_S:
            self._last_plain = time.monotonic()
            snap = self.snapshot()
            self.log("  ".join(f"{k}={_num(v)}" for k, v in snap.items() if k != "elapsed"))
