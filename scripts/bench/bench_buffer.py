"""Benchmark the replay buffer: groups/s through put -> take -> ack, against raw Redis stream calls in the same run.

    python scripts/bench/bench_buffer.py [--json] [--quick] [--url redis://...] [--batch 32] [--seconds 3]

Each group is 5 trajectories of ~1,500 tokens (200 prompt + 1,300 response), about 130 KB of msgpack. Paths:
- ours:      ReplayBuffer.put_groups (encode + Lua put per group, one pipeline per batch) -> take(batch) ->
             ack(ids) (decode included, Lua ack per batch);
- ours_each: the same with put_group one group at a time (what a generator does when one group finishes);
- raw:       the already-encoded payloads through pipelined XADD, XREADGROUP COUNT batch, XACK + XDEL
             (XDEL because our ack deletes acked entries too, and it keeps Redis memory flat).
Rounds of the paths alternate so a busy machine slows them alike; the median round rate is reported. Without
--url a local redis-server (AOF, `--appendfsync everysec` by default; a run's own Redis uses `always`, see
`buffer.local_appendfsync`) is started in a temporary directory.

`--producers N` measures the layout of N engines feeding one learner instead: N producer processes, each putting
groups one at a time (`put_group`, as a generator worker does when a group finishes), and one consumer (this
process) taking and acking batches, against one producer in the same run (the phases alternate). It prints groups/s
produced and consumed, the ratio N vs 1, and what the time went to: CPU seconds per group of redis-server, of the
producers and of the consumer, Redis's own time per command (INFO commandstats), the codec's cost measured alone,
round trips per group, and how busy the machine's cores were (other processes included).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil
import redis  # noqa: E402 - the baseline's raw client

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from buffer.codec import decode_group, encode_group  # noqa: E402
from buffer.redis_buffer import ReplayBuffer  # noqa: E402
from fakes.groups import make_group, make_prompt  # noqa: E402
from sr1.launch.redis_server import LocalRedis  # noqa: E402


def run_ours(buf: ReplayBuffer, groups, batch: int, seconds: float, counter: list[int], each: bool) -> float:
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        chunk = []
        for _ in range(batch):
            counter[0] += 1
            template = groups[counter[0] % len(groups)]
            chunk.append(dataclasses.replace(template, group_id=f"bench/{counter[0]}"))
        if each:
            for group in chunk:
                buf.put_group(group, "")
        else:
            buf.put_groups([(group, "") for group in chunk])
        taken = buf.take(batch, block_ms=0)
        assert len(taken) == batch, f"took {len(taken)} of {batch}"
        buf.ack([t.entry_id for t in taken])
        done += batch
    return done / (time.perf_counter() - start)


def run_raw(
    client, stream: str, payloads: list[bytes], batch: int, seconds: float, counter: list[int]
) -> float:
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        pipe = client.pipeline(transaction=False)
        for _ in range(batch):
            counter[0] += 1
            pipe.xadd(stream, {"gid": f"raw/{counter[0]}", "d": payloads[counter[0] % len(payloads)]})
        pipe.execute()
        got = client.xreadgroup("raw", "c", {stream: ">"}, count=batch)
        ids = [eid for eid, _ in got[0][1]]
        assert len(ids) == batch
        pipe = client.pipeline(transaction=False)
        pipe.xack(stream, "raw", *ids)
        pipe.xdel(stream, *ids)
        pipe.execute()
        done += batch
    return done / (time.perf_counter() - start)


def bench(url: str, batch: int, seconds: float, rounds: int) -> dict:
    templates = [
        make_group(make_prompt(i), n=5, prompt_len=200, response_len=1300, seed=i) for i in range(16)
    ]
    payloads = [encode_group(g) for g in templates]
    buf = ReplayBuffer(url, "bench")
    client = redis.Redis.from_url(buf.url)  # the baseline: raw stream calls on their own connection
    stream = "bench:raw"
    client.delete(stream)
    client.xgroup_create(stream, "raw", id="0", mkstream=True)
    counters = {"ours": [0], "raw": [0]}
    # warm up: scripts loaded, connections open, allocator warm
    run_ours(buf, templates, batch, 0.2, counters["ours"], each=False)
    run_raw(client, stream, payloads, batch, 0.2, counters["raw"])
    rates: dict[str, list[float]] = {"ours": [], "ours_each": [], "raw": []}
    for _ in range(rounds):
        rates["raw"].append(run_raw(client, stream, payloads, batch, seconds, counters["raw"]))
        rates["ours"].append(run_ours(buf, templates, batch, seconds, counters["ours"], each=False))
        rates["ours_each"].append(run_ours(buf, templates, batch, seconds / 2, counters["ours"], each=True))
    stats = buf.stats()
    assert stats["buffer/depth"] == 0 and stats["buffer/taken_unacked"] == 0
    client.delete(stream)
    median = {name: statistics.median(values) for name, values in rates.items()}
    group_bytes = statistics.mean(len(p) for p in payloads)
    return {
        "groups_per_s_ours": round(median["ours"], 1),
        "groups_per_s_ours_put_each": round(median["ours_each"], 1),
        "groups_per_s_raw": round(median["raw"], 1),
        "ratio_ours_vs_raw": round(median["ours"] / median["raw"], 3),
        "ratio_ours_put_each_vs_raw": round(median["ours_each"] / median["raw"], 3),
        "mb_per_s_ours": round(median["ours"] * group_bytes / 1e6, 1),
        "mb_per_s_raw": round(median["raw"] * group_bytes / 1e6, 1),
        "group_bytes": int(group_bytes),
        "trajectories_per_group": 5,
        "tokens_per_trajectory": 1500,
        "batch": batch,
        "seconds_per_round": seconds,
        "rounds": rounds,
        "all_rounds": {name: [round(v, 1) for v in values] for name, values in rates.items()},
        "target_ratio": 0.7,
        "target_groups_per_s": 1000,
        "meets_targets": median["ours"] / median["raw"] >= 0.7 and median["ours"] >= 1000,
    }


# -- N producers, one consumer (`--producers N`) -------------------------------------------------------------------

SCALE_NAMESPACE = "bench-scale"
MAX_BACKLOG = 256  # groups put and not yet taken: producers wait beyond it, as admission bounds a real run


def _templates() -> list:
    return [make_group(make_prompt(i), n=5, prompt_len=200, response_len=1300, seed=i) for i in range(16)]


def producer(url: str, index: int, active, stop, produced, consumed) -> None:
    """One engine's worker: while `active` is set, put groups one at a time (encode + one MULTI round trip each)."""
    buf = ReplayBuffer(url, SCALE_NAMESPACE)
    templates = _templates()
    count = 0
    while not stop.is_set():
        if not active.wait(timeout=0.1):
            continue
        if sum(p.value for p in produced) - consumed.value > MAX_BACKLOG:
            time.sleep(0.002)  # the consumer is behind: hold back, as admission control does
            continue
        count += 1
        template = templates[count % len(templates)]
        buf.put_group(dataclasses.replace(template, group_id=f"p{index}/{count}"), "")
        produced[index].value += 1  # this producer is the only writer of its counter
    buf.close()


def _redis_cpu_s(client) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _machine_busy_s() -> float:
    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


def _snapshot(client, processes: list[psutil.Process], produced) -> dict:
    return {
        "wall": time.perf_counter(),
        "redis_cpu": _redis_cpu_s(client),
        "producers_cpu": sum(sum(p.cpu_times()[:2]) for p in processes),
        "consumer_cpu": time.process_time(),
        "machine_busy": _machine_busy_s(),
        "commands": {k[len("cmdstat_") :]: v for k, v in client.info("commandstats").items()},
        "produced": sum(p.value for p in produced),
    }


def _drain(buf: ReplayBuffer, batch: int, consumed) -> None:
    """Take and ack what the producers left in the stream (they are paused)."""
    time.sleep(0.3)  # a put in flight lands first
    while taken := buf.take(batch, block_ms=100):
        buf.ack([t.entry_id for t in taken])
        consumed.value += len(taken)


def scale_phase(
    buf: ReplayBuffer, client, pool: dict, active_producers: int, seconds: float, batch: int
) -> dict:
    """`active_producers` producers put while this process takes and acks for `seconds`; rates and costs."""
    processes = [psutil.Process(p.pid) for p in pool["processes"]]
    consumed = pool["consumed"]
    before = _snapshot(client, processes, pool["produced"])
    for event in pool["active"][:active_producers]:
        event.set()
    got = 0
    while time.perf_counter() - before["wall"] < seconds:
        taken = buf.take(batch, block_ms=50)
        if taken:
            buf.ack([t.entry_id for t in taken])
            got += len(taken)
            consumed.value += len(taken)
    after = _snapshot(client, processes, pool["produced"])
    for event in pool["active"]:
        event.clear()
    _drain(buf, batch, consumed)
    wall = after["wall"] - before["wall"]
    per_group = 1000.0 / max(got, 1)  # milliseconds per consumed group
    commands = {}
    for name, stat in after["commands"].items():
        calls = stat["calls"] - before["commands"].get(name, {}).get("calls", 0)
        usec = stat["usec"] - before["commands"].get(name, {}).get("usec", 0)
        if calls:
            commands[name] = {
                "calls_per_group": round(calls / max(got, 1), 3),
                "redis_us_per_group": round(usec / max(got, 1), 1),
            }
    cpu = {part: after[part] - before[part] for part in ("redis_cpu", "producers_cpu", "consumer_cpu")}
    return {
        "producers": active_producers,
        "consumed_per_s": got / wall,
        "produced_per_s": (after["produced"] - before["produced"]) / wall,
        "cpu_ms_per_group": {part.removesuffix("_cpu"): round(v * per_group, 3) for part, v in cpu.items()},
        "cores_busy": {
            **{part.removesuffix("_cpu"): round(v / wall, 2) for part, v in cpu.items()},
            "machine": round((after["machine_busy"] - before["machine_busy"]) / wall, 2),
        },
        # as INFO commandstats counts them: `exec` includes the commands of its transaction (a producer's XADD and
        # PUT script) and `eval` the calls its script makes, which are also counted on their own
        "redis_commands": commands,
    }


def codec_cost_ms(seconds: float = 0.5) -> dict:
    """Milliseconds to encode and to decode one benchmark group, alone in this process."""
    templates = _templates()
    payloads = [encode_group(g) for g in templates]
    out = {}
    for name, work in (
        ("encode", lambda i: encode_group(templates[i % 16])),
        ("decode", lambda i: decode_group(payloads[i % 16])),
    ):
        count, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            work(count)
            count += 1
        out[f"{name}_ms"] = round((time.perf_counter() - start) * 1000 / count, 3)
    return out


def bench_producers(url: str, producers: int, batch: int, seconds: float, rounds: int) -> dict:
    """1 producer and `producers` producers in alternating phases (one consumer); medians and the ratio."""
    ctx = multiprocessing.get_context("spawn")  # clean processes: no Redis connection or thread inherited
    stop = ctx.Event()
    pool = {
        "active": [ctx.Event() for _ in range(producers)],
        "consumed": ctx.Value("q", 0, lock=False),
        "produced": [ctx.Value("q", 0, lock=False) for _ in range(producers)],
    }
    buf = ReplayBuffer(url, SCALE_NAMESPACE)
    client = redis.Redis.from_url(url)
    pool["processes"] = [
        ctx.Process(
            target=producer,
            args=(url, i, pool["active"][i], stop, pool["produced"], pool["consumed"]),
            daemon=True,
        )
        for i in range(producers)
    ]
    for process in pool["processes"]:
        process.start()
    try:
        # warm up until every producer process has started and put a group (imports, connections): on a busy
        # machine spawning them takes longer than a phase, and a phase timed before that would measure nothing
        deadline = time.monotonic() + 300
        while not all(count.value > 0 for count in pool["produced"]):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the {producers} producer processes did not all start within 300 s")
            scale_phase(buf, client, pool, producers, min(seconds, 1.0), batch)
        phases: dict[int, list[dict]] = {1: [], producers: []}
        for _ in range(rounds):
            for k in (1, producers):
                phases[k].append(scale_phase(buf, client, pool, k, seconds, batch))
    finally:
        stop.set()
        for process in pool["processes"]:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
        client.close()
        buf.close()

    def median_phase(k: int) -> dict:
        runs = sorted(phases[k], key=lambda r: r["consumed_per_s"])
        return runs[len(runs) // 2]

    one, many = median_phase(1), median_phase(producers)
    return {
        "producers": producers,
        "consumed_per_s_1": round(one["consumed_per_s"], 1),
        f"consumed_per_s_{producers}": round(many["consumed_per_s"], 1),
        "ratio_vs_1_producer": round(many["consumed_per_s"] / one["consumed_per_s"], 3),
        "all_rounds_consumed_per_s": {
            k: [round(r["consumed_per_s"], 1) for r in v] for k, v in phases.items()
        },
        "phase_1": one,
        f"phase_{producers}": many,
        "codec": codec_cost_ms(),
        "machine_cores": psutil.cpu_count(),
        "batch": batch,
        "seconds_per_phase": seconds,
        "rounds": rounds,
        "max_backlog_groups": MAX_BACKLOG,
    }


def _print_scale(result: dict) -> None:
    n = result["producers"]
    print(
        f"1 producer: {result['consumed_per_s_1']:,.0f} groups/s; {n} producers: "
        f"{result[f'consumed_per_s_{n}']:,.0f} groups/s; ratio {result['ratio_vs_1_producer']} "
        f"(rounds: {result['all_rounds_consumed_per_s']})"
    )
    codec = result["codec"]
    print(
        f"codec alone: encode {codec['encode_ms']} ms, decode {codec['decode_ms']} ms per group; "
        f"{result['machine_cores']} cores"
    )
    for k in (1, n):
        phase = result[f"phase_{k}"]
        top = sorted(phase["redis_commands"].items(), key=lambda kv: -kv[1]["redis_us_per_group"])[:5]
        print(
            f"  {k} producer(s): produced {phase['produced_per_s']:,.0f}/s, consumed {phase['consumed_per_s']:,.0f}/s;"
            f" CPU ms per group {phase['cpu_ms_per_group']}; cores busy {phase['cores_busy']}; Redis time per group "
            "(exec includes its transaction): "
            + ", ".join(f"{name} {c['redis_us_per_group']} us x{c['calls_per_group']}" for name, c in top)
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="an existing Redis (default: start a local one)")
    parser.add_argument("--batch", type=int, default=32, help="groups per put/take/ack batch")
    parser.add_argument("--seconds", type=float, default=2.0, help="seconds per path per round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; the median is reported")
    parser.add_argument("--quick", action="store_true", help="short run (0.5 s per path, 2 rounds)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--appendfsync",
        choices=("everysec", "always"),
        default="everysec",
        help="fsync policy of the local Redis (a run's own Redis: buffer.local_appendfsync=always)",
    )
    parser.add_argument(
        "--producers",
        type=int,
        default=0,
        help="N producer processes and one consumer, against 1 producer (the N-engine layout)",
    )
    args = parser.parse_args(argv)
    if args.producers < 0:
        parser.error(f"--producers must be >= 1 (or 0: the single-process paths), got {args.producers}")
    seconds, rounds = (0.5, 2) if args.quick else (args.seconds, args.rounds)

    def run(url: str) -> dict:
        if args.producers:
            return bench_producers(url, args.producers, args.batch, max(seconds, 1.0), rounds)
        return bench(url, args.batch, seconds, rounds)

    if args.url:
        result = run(args.url)
    else:
        with (
            tempfile.TemporaryDirectory() as tmp,
            LocalRedis(Path(tmp), appendfsync=args.appendfsync) as server,
        ):
            result = run(server.url)
    result["appendfsync"] = None if args.url else args.appendfsync
    if args.json:
        print(json.dumps(result))
    elif args.producers:
        _print_scale(result)
    else:
        print(
            f"ours {result['groups_per_s_ours']:,.0f} groups/s ({result['mb_per_s_ours']} MB/s), "
            f"put one by one {result['groups_per_s_ours_put_each']:,.0f} groups/s, "
            f"raw {result['groups_per_s_raw']:,.0f} groups/s ({result['mb_per_s_raw']} MB/s): "
            f"ratio {result['ratio_ours_vs_raw']} (target >= 0.7, >= 1,000 groups/s)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
