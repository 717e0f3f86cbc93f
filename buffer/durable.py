"""Operations of `ReplayBuffer` for groups a checkpoint made durable, kept until no checkpoint may be given up for an
older one.

    buf.ack_durable(entry_ids, group_ids, version=8)     # the learner, once checkpoint step_8 is written
    buf.recall_durable(prompt_of, after=4, version=9)    # a resume that found step_8 torn and loaded step_4
    buf.forget_durable(up_to=4)                          # step_4 is the oldest checkpoint kept

An ack is final for the stream: the group leaves it. But a checkpoint can be found torn later (a disk that lost
blocks, a file cut short), and the learner then resumes from an older one: the groups trained in the steps between
are inside no surviving weights. `<namespace>:durable` (a sorted set: group_id -> the version of the checkpoint that
acked it) keeps their ids until the checkpoints before that version are pruned, so that such a resume releases
their prompts again, as it does for the groups trained after the last checkpoint (`recall_trained`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from buffer import lua
from buffer.codec import encode_prompt
from buffer.records import PromptRecord
from buffer.stats import _s


class DurableGroups:
    """Mixed into `ReplayBuffer` (buffer/redis_buffer.py), whose `_redis`, `key()`, `ack()` and `_script()` it uses.
    Each write is safe to send again after a lost reply (buffer/connection.py resends it); each method says how."""

    def ack_durable(self, entry_ids: list[str], group_ids: list[str], version: int) -> None:
        """Ack groups the checkpoint of `version` holds, and record them as made durable by it, in one
        transaction. Sent again: the same scores are set again and the ack acks nothing."""
        if not entry_ids and not group_ids:
            return
        pipe = self._redis.pipeline(transaction=True)
        if group_ids:
            pipe.zadd(self.key("durable"), dict.fromkeys(group_ids, int(version)))
        self.ack(entry_ids, client=pipe)
        pipe.execute()

    def durable_after(self, version: int) -> list[str]:
        """The groups made durable by checkpoints newer than `version`."""
        ids = self._redis.zrange(self.key("durable"), f"({int(version)}", "+inf", byscore=True)
        return [_s(i) for i in ids]

    def recall_durable(self, prompt_of: Callable[[str], PromptRecord], after: int, version: int) -> list[str]:
        """Generate again the groups acked by checkpoints newer than `after` (the checkpoint a resume fell back to):
        their ids leave the durable record and the put set and their prompts are released anew at `version`, in one
        script. Returns their group ids. Sent again after a lost reply it recalls nothing (only groups still in the
        durable record are recalled), so no prompt is released twice."""
        gids = self.durable_after(after)
        if not gids:
            return []
        args: list = []
        for gid in gids:
            prompt = dataclasses.replace(prompt_of(gid), release_version=version)
            args += [gid, int(version), encode_prompt(prompt)]
        keys = [self.key(k) for k in ("durable", "put_ids", "counters", "prompts", "inflight")]
        self._script(lua.RECALL_DURABLE, keys, args)
        return gids

    def forget_durable(self, up_to: int) -> None:
        """Forget the groups made durable by checkpoints at or before `up_to` (no resume can go back past it).
        Sent again: nothing is left to remove."""
        self._redis.zremrangebyscore(self.key("durable"), "-inf", int(up_to))
