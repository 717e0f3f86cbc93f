"""The report of an evaluation: the task's metrics over every answered item, overall and per data source.

Every number the task's `score` reports (Search-R1: `em`, `f1`, `substring_em`, `well_formed`) is averaged into
`eval/<metric>` and, per data source, `eval/<metric>/<source>`; `eval/reward` is the mean reward. With `samples` k > 1
each prompt is answered k times and `eval/pass@k/<metric>` counts a prompt as solved when any sample scores 1.
`merge_answers` summarizes the answers of every shard as if one worker had answered all; `per_source_table`,
`markdown` and `plot` are what `sr1 eval` writes.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from buffer.records import FINISH_REASONS

# what an item keeps when it travels through Redis (a training-time evaluation of thousands of prompts)
COMPACT_FIELDS = ("group_id", "data_source", "sample", "metrics", "tool_calls", "turns", "finish_reason")


def summarize(items: list[dict[str, Any]]) -> dict[str, float]:
    """Means over evaluated items: overall and per data source, for the reward and every numeric task metric; the
    share of each finish reason; pass@k when prompts were sampled several times."""
    n = len(items)
    out: dict[str, float] = {"eval/n": n}
    if not n:
        return out
    out["eval/tool_calls_per_traj"] = sum(i["tool_calls"] for i in items) / n
    out["eval/turns_mean"] = sum(i["turns"] for i in items) / n
    reasons = Counter(i["finish_reason"] for i in items)
    for reason in sorted(set(FINISH_REASONS) | set(reasons)):
        out[f"eval/finish/{reason}"] = reasons[reason] / n
    by_source: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for item in items:
        by_source[item["data_source"]].append(item)
    names = sorted({k for item in items for k in item["metrics"]})
    for name in names:
        out[f"eval/{name}"] = sum(i["metrics"].get(name, 0.0) for i in items) / n
    for source, rows in sorted(by_source.items()):
        for name in names:
            out[f"eval/{name}/{source}"] = sum(r["metrics"].get(name, 0.0) for r in rows) / len(rows)
        out[f"eval/tool_calls_per_traj/{source}"] = sum(r["tool_calls"] for r in rows) / len(rows)
        out[f"eval/n/{source}"] = len(rows)
    samples = max(int(i.get("sample", 0)) for i in items) + 1
    if samples > 1:
        out |= _pass_at_k(items, names, samples)
    return out


def _pass_at_k(items: list[dict[str, Any]], names: list[str], k: int) -> dict[str, float]:
    """A prompt counts as solved for a metric when any of its k samples scores 1 on it."""
    best: dict[str, dict[str, float]] = defaultdict(dict)
    source_of: dict[str, str] = {}
    for item in items:
        source_of[item["group_id"]] = item["data_source"]
        for name in names:
            value = item["metrics"].get(name, 0.0)
            best[item["group_id"]][name] = max(best[item["group_id"]].get(name, 0.0), value)
    out: dict[str, float] = {"eval/samples": k}
    for name in names:
        solved = [float(b.get(name, 0.0) >= 1.0) for b in best.values()]
        out[f"eval/pass@{k}/{name}"] = sum(solved) / len(solved)
        for source in sorted(set(source_of.values())):
            rows = [float(b.get(name, 0.0) >= 1.0) for g, b in best.items() if source_of[g] == source]
            out[f"eval/pass@{k}/{name}/{source}"] = sum(rows) / len(rows)
    return out


class EvaluationFailed(RuntimeError):
    """Every shard of an evaluation was answered with an error (a bad request, unreadable test data, an engine
    error): there is nothing to summarize."""


def merge_answers(answers: list[dict[str, Any]]) -> dict[str, Any]:
    """The report: one summary of the answers of every shard of an evaluation (each holds its `items`). Shards
    a worker answered with an `error` are left out and counted (`eval/failed_shards`); if all failed,
    EvaluationFailed."""
    errors = [str(r["error"]) for r in answers if r.get("error")]
    if len(errors) == len(answers):
        raise EvaluationFailed("every shard failed: " + "; ".join(sorted(set(errors))))
    answers = [r for r in answers if not r.get("error")]
    items = [item for answer in answers for item in answer["items"]]
    versions = [int(r["eval/version"]) for r in answers]
    return summarize(items) | {
        "eval/failed_shards": len(errors),
        "eval/version": min(versions),
        "eval/version_max": max(
            versions
        ),  # shards pin their own engine; all hold at least the requested version
        "eval/seconds": max(float(r.get("eval/seconds", 0.0)) for r in answers),
        "eval/workers": len(answers),
    }


def compact_item(item: dict[str, Any]) -> dict[str, Any]:
    """What `merge_answers` needs of an item (no texts)."""
    return {k: item[k] for k in COMPACT_FIELDS}


def per_source_table(items: list[dict], summary: dict[str, float]) -> list[dict[str, Any]]:
    """One row per data source (and `all`): questions, EM, F1, searches and turns per question, finish reasons."""
    by_source: dict[str, list[dict]] = defaultdict(list)
    for item in items:
        by_source[item["data_source"]].append(item)
    rows = []
    for source in [*sorted(by_source), "all"]:
        group = items if source == "all" else by_source[source]
        suffix = "" if source == "all" else f"/{source}"
        reasons = Counter(i["finish_reason"] for i in group)
        rows.append(
            {
                "source": source,
                "n": len(group),
                "em": summary.get(f"eval/em{suffix}"),
                "f1": summary.get(f"eval/f1{suffix}"),
                "searches": sum(i["tool_calls"] for i in group) / len(group),
                "turns": sum(i["turns"] for i in group) / len(group),
                "finish": ", ".join(f"{r} {c / len(group):.0%}" for r, c in reasons.most_common()),
            }
        )
        pass_key = next(
            (k for k in summary if k.startswith("eval/pass@") and k.endswith(f"/em{suffix}")), None
        )
        if pass_key:
            rows[-1]["pass@k"] = summary[pass_key]
    return rows


def format_value(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def markdown(rows: list[dict], header: dict[str, Any]) -> str:
    passk = any("pass@k" in r for r in rows)
    lines = [f"# sr1 eval: {header['checkpoint']}", ""]
    lines += [f"- {k}: {v}" for k, v in header.items() if k != "checkpoint"]
    lines += [
        "",
        "| source | n | EM | F1 |" + (" pass@k EM |" if passk else "") + " searches/q | turns | finish |",
        "|---|---|---|---|" + ("---|" if passk else "") + "---|---|---|",
    ]
    for r in rows:
        extra = f" {format_value(r.get('pass@k'))} |" if passk else ""
        lines.append(
            f"| {r['source']} | {r['n']} | {format_value(r['em'])} | {format_value(r['f1'])} |{extra} "
            f"{r['searches']:.2f} | {r['turns']:.2f} | {r['finish']} |"
        )
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(4.0, 1.1 * len(rows)), 3.2))
    names = [r["source"] for r in rows]
    ems = [r["em"] or 0.0 for r in rows]
    bars = ax.bar(names, ems, color=["#4c72b0"] * (len(rows) - 1) + ["#dd8452"])
    ax.bar_label(bars, labels=[f"{v:.2f}" for v in ems], fontsize=8)
    ax.set_ylim(0, max(1.0, max(ems) * 1.15))
    ax.set_ylabel("exact match")
    ax.set_title(title, fontsize=9)
    ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(path)


def read_evals(run_dir: Any) -> list[dict[str, Any]]:
    """The evaluations a run recorded (`evals.jsonl`), oldest first; a torn last line is skipped."""
    path = Path(run_dir) / "evals.jsonl"
    rows = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows
