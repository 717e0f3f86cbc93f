"""Benchmark the replay buffer: groups/s through put -> take -> ack, against raw Redis stream calls in the same run.

    python scripts/bench_buffer.py [--json] [--quick] [--url redis://...] [--batch 32] [--seconds 3]

Each group is 5 trajectories of ~1,500 tokens (200 prompt + 1,300 response), about 130 KB of msgpack. Paths:
- ours:      ReplayBuffer.put_groups (encode + Lua put per group, one pipeline per batch) -> take(batch) ->
             ack(ids) (decode included, Lua ack per batch);
- ours_each: the same with put_group one group at a time (what a generator does when one group finishes);
- raw:       the already-encoded payloads through pipelined XADD, XREADGROUP COUNT batch, XACK + XDEL
             (XDEL because our ack deletes acked entries too, and it keeps Redis memory flat).
Rounds of the paths alternate so a busy machine slows them alike; the median round rate is reported. Without
--url a local redis-server (AOF, appendfsync everysec: the run default) is started in a temporary directory.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import redis  # noqa: E402 - the baseline's raw client

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from buffer.codec import encode_group  # noqa: E402
from buffer.redis_buffer import ReplayBuffer  # noqa: E402
from sr1.launch.redis_server import LocalRedis  # noqa: E402
from tests.fakes.groups import make_group, make_prompt  # noqa: E402


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="an existing Redis (default: start a local one)")
    parser.add_argument("--batch", type=int, default=32, help="groups per put/take/ack batch")
    parser.add_argument("--seconds", type=float, default=2.0, help="seconds per path per round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; the median is reported")
    parser.add_argument("--quick", action="store_true", help="short run (0.5 s per path, 2 rounds)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    seconds, rounds = (0.5, 2) if args.quick else (args.seconds, args.rounds)
    if args.url:
        result = bench(args.url, args.batch, seconds, rounds)
    else:
        with tempfile.TemporaryDirectory() as tmp, LocalRedis(Path(tmp)) as server:
            result = bench(server.url, args.batch, seconds, rounds)
    if args.json:
        print(json.dumps(result))
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
