"""Operations of `ReplayBuffer` on prompt leases: a generator claims prompts, renews, fails or gives them back.

    claimed = buf.claim_prompts("gen-0", 4)              # a claim is a lease: expired leases of anyone first
    buf.renew_leases("gen-0", [c.entry_id for c in claimed])   # still working on them (long multi-turn rollouts)
    buf.fail_prompt("gen-0", claimed[0].entry_id, "tool call timed out")   # another try at once
    buf.release_claims("gen-0", buf.leased_by("gen-0"))  # shutdown, or a restart giving back its earlier leases

A lease is a pending entry of `<namespace>:prompts` in the consumer group "generators"; one idle longer than `lease_s`
is reclaimed by the next claim of any generator. A prompt delivered `max_prompt_deliveries` times is dead-lettered
(buffer/dead_letters.py) with the error of its last failed try (`<namespace>:prompt_errors`), or as a poison prompt
whose leases kept expiring. Prompts are released by the feeder (`release_prompts`, buffer/group_ids.py) and finished
by the put of their group (`put_groups`, buffer/redis_buffer.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from buffer.codec import CodecError, decode_prompt
from buffer.dead_letters import DEAD_LETTER_REASON_CHARS
from buffer.lua import GENERATORS
from buffer.records import PromptRecord
from buffer.stats import _s


@dataclass
class ClaimedPrompt:
    entry_id: str
    prompt: PromptRecord


class PromptLeases:
    """Mixed into `ReplayBuffer` (buffer/redis_buffer.py), whose `_redis`, `key()`, `lease_s`,
    `max_prompt_deliveries`, `_reclaim()`, `_read_new()` and `_dead_letter()` it uses. Each write is safe to send
    again after a lost reply (buffer/connection.py resends it); each method says how."""

    def claim_prompts(self, consumer: str, count: int, block_ms: int = 0) -> list[ClaimedPrompt]:
        """Lease up to `count` prompts: expired leases of any generator first, then new prompts.

        `block_ms` <= 0 does not wait; otherwise wait up to that long for new prompts (at most the client's
        `max_block_ms`). A claim whose reply was lost leaves prompts leased to `consumer` that it never saw: the
        worker gives them back (`leased_by`, `release_claims`) after a reconnect, else their leases expire.
        """
        stream = self.key("prompts")
        entries = []
        for eid, fields, delivered in self._reclaim(
            stream, GENERATORS, consumer, self.lease_s, count, skip_own=False, throttle=False
        ):
            if delivered >= self.max_prompt_deliveries:
                # a prompt that failed (or whose lease expired: it kills or hangs generators) on every delivery must
                # not block the learner: it goes, with its last error, and admission releases another in its place
                error = self._redis.hget(self.key("prompt_errors"), eid)
                tried = f"after {delivered} deliveries (max_prompt_deliveries={self.max_prompt_deliveries})"
                if error is not None:
                    reason, counter = f"prompt failed {tried}: {_s(error)}", "failed_prompts"
                else:
                    reason, counter = f"prompt lease expired {tried}", "poison_prompts"
                self._dead_letter(stream, GENERATORS, eid, fields, reason, counter=counter)
            else:
                entries.append((eid, fields))
        if len(entries) < count:
            new = self._read_new(stream, GENERATORS, consumer, count - len(entries), block_ms)
            entries += [(eid, fields) for eid, fields in new if fields]
        claimed = []
        for eid, fields in entries:
            try:
                claimed.append(ClaimedPrompt(_s(eid), decode_prompt(fields.get(b"d"))))
            except CodecError as err:
                self._dead_letter(stream, GENERATORS, eid, fields, str(err))
        return claimed

    def renew_leases(self, consumer: str, entry_ids: list[str]) -> None:
        """Reset the idle time of prompts this generator is still working on (long multi-turn rollouts).
        Sent again: the idle time is reset again. Delivered late (after another generator reclaimed the lease) it
        takes the lease back to `consumer`, which holds no task for it: the lease expires again and is reclaimed."""
        if entry_ids:
            self._redis.xclaim(self.key("prompts"), GENERATORS, consumer, 0, entry_ids, justid=True)

    def leased_by(self, consumer: str, count: int = 10_000) -> list[str]:
        """Entry ids of the prompts `consumer` holds a lease on (after a restart: the leases of its earlier life)."""
        pending = self._redis.xpending_range(
            self.key("prompts"), GENERATORS, "-", "+", count, consumername=consumer
        )
        return [_s(p["message_id"]) for p in pending]

    def fail_prompt(self, consumer: str, entry_id: str, error: str) -> None:
        """A generator could not finish this prompt: record the error and give the lease back, so that another try
        starts at once; after `max_prompt_deliveries` tries the prompt is dead-lettered with this error.
        Sent again: the same error is set again and the lease given back again (a claim, not this, counts tries)."""
        self._redis.hset(self.key("prompt_errors"), entry_id, error[:DEAD_LETTER_REASON_CHARS])
        self.release_claims(consumer, [entry_id])

    def release_claims(self, consumer: str, entry_ids: list[str]) -> None:
        """Give leased prompts back (shutdown): they look expired, so the next claim by anyone takes them.
        Sent again: they look expired again (JUSTID: the delivery count is not raised)."""
        if entry_ids:
            idle_ms = int(self.lease_s * 1000) + 1000
            self._redis.xclaim(
                self.key("prompts"), GENERATORS, consumer, 0, entry_ids, idle=idle_ms, justid=True
            )
