"""Operations of `ReplayBuffer` that set a prompt or group aside for good, with its reason: the dead letters.

A prompt or group that can never be used (a payload that does not decode or is over `max_payload_bytes`, a prompt that
failed or whose lease expired on every delivery, a group the learner cannot train) leaves its stream in one script
(buffer/lua.py DEAD_LETTER): the entry is acked and deleted, its reason and the head of its payload
(DEAD_LETTER_HEAD_BYTES) go to `<namespace>:dead` (about DEAD_LETTER_MAXLEN entries kept), `<namespace>:counters`
counts it under its reason, and a group still in flight leaves the in-flight set (counted `abandoned`), so that
admission releases another prompt in its place. Sent again after a lost reply the script does nothing (the entry was
acked by the first run).

The callers are the buffer's own operations: `claim_prompts` (buffer/prompt_leases.py), `put_groups`, `take`,
`pending_groups` and `dead_letter_taken` (buffer/redis_buffer.py).
"""

from __future__ import annotations

import logging
from typing import Any

from buffer import lua
from buffer.lua import GENERATORS
from buffer.records import Group
from buffer.stats import _s

log = logging.getLogger(__name__)

DEAD_LETTER_MAXLEN = 10_000
DEAD_LETTER_HEAD_BYTES = 4096  # how much of a rejected payload the dead-letter entry keeps for debugging
DEAD_LETTER_REASON_CHARS = 1000


class DeadLetters:
    """Mixed into `ReplayBuffer` (buffer/redis_buffer.py), whose `_redis`, `key()`, `max_payload_bytes` and
    `_script()` it uses."""

    def _reject_oversized(self, pipe, group: Group, payload: bytes, prompt_entry_id: str) -> None:
        reason = f"payload of {len(payload)} bytes exceeds max_payload_bytes={self.max_payload_bytes}"
        log.warning("group %s rejected: %s", group.group_id, reason)
        # the group will never arrive: its prompt is finished, it leaves the in-flight set (the learner does not wait
        # for it) and admission releases another prompt in its place
        self._dead_letter_script(
            "put",
            self.key("prompts"),
            GENERATORS,
            prompt_entry_id,
            group.group_id,
            reason,
            payload,
            "oversized",
            pipe,
        )

    def _dead_letter_script(
        self,
        stream_name: str,
        stream: str,
        group: str,
        entry_id: str,
        gid: str,
        reason: str,
        payload: bytes,
        counter: str,
        client: Any = None,
    ) -> Any:
        keys = [
            self.key("dead"),
            self.key("counters"),
            stream,
            self.key("inflight"),
            self.key("prompt_errors"),
        ]
        args = [
            entry_id,
            group,
            gid,
            reason,
            payload[:DEAD_LETTER_HEAD_BYTES],
            counter,
            DEAD_LETTER_MAXLEN,
            stream_name,
        ]
        return self._script(lua.DEAD_LETTER, keys, args, client=client)

    def _dead_letter(
        self,
        stream: str,
        group: str,
        entry_id: bytes | str,
        fields: dict,
        reason: str,
        counter: str = "malformed",
    ) -> None:
        """Move an entry aside with the reason, count it under `counter`, and finish it so nobody reads it again; a
        group in flight leaves the in-flight set and is replaced by admission (`abandoned`). One script (buffer/lua.py
        DEAD_LETTER); sent again after a lost reply it does nothing (the entry was acked by the first run)."""
        gid = _s(fields.get(b"gid", b""))
        payload = fields.get(b"d", b"") or b""
        log.warning("dead-lettering %s entry %s (group %r): %s", stream, _s(entry_id), gid, reason)
        self._dead_letter_script(stream, stream, group, _s(entry_id), gid, reason, payload, counter)
