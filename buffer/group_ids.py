"""Operations of `ReplayBuffer` on the group ids it remembers as released and as put: de-duplication with a bound.

    buf.release_prompts(prompts, positions=[40, 41])   # the feeder: where each prompt sits in its dataset order
    buf.forget_ids(position=48, version=6, record=run_dir / RELEASED_RECORD)   # once checkpoint step_6 is written
    released_group_ids(client, "sr1", run_dir / RELEASED_RECORD)            # an audit: every id the run released

Two sorted sets de-duplicate. `<namespace>:released_ids` (group_id -> the feeder position it was released from, -1
without one): a group id released before is skipped, e.g. when a resumed feeder replays its cursor.
`<namespace>:put_ids` (group_id -> the group's release version): a second put of a group is a counted duplicate,
never delivered (a put resent after a lost reply, a generator whose lease expired finishing late).

Neither needs every id of the run. `<namespace>:forgotten_below` (a hash, `position` and `version`, each only going
up) is a watermark that stands for the ids the sets have forgotten:

- every feeder position below `position` was released: the feeder moves its cursor only past prompts that
  `release_prompts` released or skipped as released (it takes them back when the call fails), and the learner passes
  the cursor saved in a checkpoint. A release from such a position is skipped without looking at the set, whatever
  checkpoint the feeder resumed from (an older one than the watermark's too).
- a group released below `version` that is no longer in flight (acked, or dead-lettered and replaced) was put, or
  left for good: a put of it is a duplicate without looking at the set. The learner passes the version of the
  checkpoint it just wrote, after acking what that checkpoint holds. A group still in flight keeps its id.

`forget_ids`, called by the learner after each checkpoint, raises the watermark and removes what it covers. Between
two checkpoints the sets hold the ids released since the last one and those of groups still in flight: about
(checkpoint_every + max_staleness + 1) x groups_per_step each, whatever the run's length. Ids released without a
position (tools, tests, `scripts/chaos/chaos.py`'s injected prompts) are kept.

An audit that needs every id the run released (`scripts/chaos/chaos.py`: nothing lost, nothing trained twice) reads them
from `record`, a file the forgotten released ids are appended to (and fsynced) before they leave Redis, and from the
set (`released_group_ids`). After a crash between the two an id may be listed twice.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis

from buffer import lua
from buffer.codec import encode_prompt
from buffer.records import PromptRecord
from buffer.stats import _s

log = logging.getLogger(__name__)

# in the run directory: the released ids Redis no longer keeps, one a line
RELEASED_RECORD = "released_groups.txt"
NO_POSITION = -1  # a release that does not come from the feeder's order


class GroupIds:
    """Mixed into `ReplayBuffer` (buffer/redis_buffer.py), whose `_redis`, `key()` and `_script()` it uses. Each write
    is safe to send again after a lost reply (buffer/connection.py resends it); each method says how."""

    def release_prompts(
        self, prompts: list[PromptRecord], positions: Sequence[int] | None = None
    ) -> list[str]:
        """Add prompts to the prompts stream and the in-flight set, counting them as released, in one step.

        `positions`: where each prompt sits in the feeder's order (its cursor), or None. A group_id released before
        (a resumed feeder replaying its cursor), or a position below the watermark, is skipped and counted as
        `duplicate_releases`; the returned list holds the entry ids of the prompts actually released.
        Sent again after a lost reply: every group id is in `released_ids` already, so nothing is released twice
        (the retry returns no ids; the feeder then looks at the counts again).
        """
        if not prompts:
            return []
        if positions is None:
            positions = [NO_POSITION] * len(prompts)
        elif len(positions) != len(prompts):
            raise ValueError(f"{len(positions)} positions for {len(prompts)} prompts")
        args: list[Any] = [len(prompts)]
        for p, position in zip(prompts, positions, strict=True):
            args += [p.group_id, int(p.release_version), int(position), encode_prompt(p)]
        keys = [self.key(k) for k in ("prompts", "released_ids", "inflight", "counters", "forgotten_below")]
        return [_s(i) for i in self._script(lua.RELEASE, keys, args) if i]

    def forget_ids(self, position: int, version: int, record: Path | None = None) -> int:
        """Forget the released ids of feeder positions below `position` and the put ids of groups released below
        `version` that are no longer in flight, and raise the watermark to both (the module docstring says why
        that is safe). The learner calls it after each checkpoint with that checkpoint's cursor and version.
        With `record`, the released ids forgotten are appended to that file (fsynced) first; when it cannot be
        written, nothing is forgotten this time (a warning says why). Returns how many ids left Redis.
        Sent again after a lost reply: the watermark is there already and nothing is left to forget."""
        if record is not None:
            below = self._redis.zrange(self.key("released_ids"), 0, f"({int(position)}", byscore=True)
            try:
                _append_ids(record, [_s(i) for i in below])
            except OSError as err:
                log.warning("group ids kept in Redis: their record %s cannot be written (%s)", record, err)
                return 0
        keys = [self.key(k) for k in ("released_ids", "put_ids", "inflight", "forgotten_below")]
        return int(self._script(lua.FORGET_IDS, keys, [int(position), int(version)]))

    def forgotten_below(self) -> tuple[int, int]:
        """The watermark: (feeder position, release version) below which ids are no longer kept (0, 0: none)."""
        position, version = self._redis.hmget(self.key("forgotten_below"), "position", "version")
        return int(position or 0), int(version or 0)

    def _upgrade_id_sets(self) -> None:
        """A namespace written by an sr1 that kept the ids in plain sets gets sorted sets (on every open; once)."""
        keys = [self.key("released_ids"), self.key("put_ids"), self.key("version")]
        if converted := self._script(lua.UPGRADE_ID_SETS, keys, []):
            log.info(
                "%d group ids of %s moved to sorted sets (written by an earlier sr1)",
                converted,
                self.namespace,
            )


def _append_ids(path: Path, ids: list[str]) -> None:
    if not ids:
        return
    with open(path, "a", encoding="utf-8") as handle:
        handle.write("".join(f"{gid}\n" for gid in ids))
        handle.flush()
        os.fsync(handle.fileno())


def released_group_ids(client: redis.Redis, namespace: str, record: Path | None) -> set[str]:
    """Every group id a run released: those `<namespace>:released_ids` still holds and those `forget_ids` wrote to
    `record` (absent: none were forgotten)."""
    ids = {_s(gid) for gid in client.zrange(f"{namespace}:released_ids", 0, -1)}
    if record is not None and Path(record).is_file():
        ids.update(line for line in Path(record).read_text(encoding="utf-8").splitlines() if line)
    return ids
