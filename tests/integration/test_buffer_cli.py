"""`sr1 buffer stats --json` as a real process against a real Redis, while a generator and a learner work."""

from __future__ import annotations

import json
import subprocess
import sys

from buffer.admission import BatchAssembler, PromptFeeder
from buffer.redis_buffer import ReplayBuffer
from fakes.groups import make_group, make_prompt


def test_stats_json_from_a_separate_process(redis_url):
    buf = ReplayBuffer(redis_url, "cli-run")
    feeder = PromptFeeder(buf, [make_prompt(i) for i in range(20)], groups_per_step=2, max_staleness=1)
    assembler = BatchAssembler(buf, groups_per_step=2, max_staleness=1)
    feeder.pump()
    for c in buf.claim_prompts("gen-0", 3):
        buf.put_group(make_group(c.prompt, n=2, response_len=16), c.entry_id)
    batch = assembler.next_batch(0, timeout_s=5)
    buf.record_consumed([0] * 10)
    buf.ack([t.entry_id for t in batch])
    buf.publish_version(1)
    buf.heartbeat("learner-0", "learner", {"loss/total": 0.5})
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "sr1",
            "buffer",
            "stats",
            "--json",
            "--url",
            redis_url,
            "--namespace",
            "cli-run",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    report = json.loads(out.stdout)
    stats = report["stats"]
    assert stats["buffer/version"] == 1 and stats["buffer/consumed"] == 2 and stats["buffer/released"] == 4
    assert stats["buffer/depth"] == 0 and stats["buffer/taken_unacked"] == 1  # the third group, held
    assert stats["buffer/inflight_groups"] == 2 and stats["buffer/pending_prompts"] == 1
    assert stats["buffer/staleness_hist/0"] == 10
    assert report["workers"][0]["metrics"] == {"loss/total": 0.5}
