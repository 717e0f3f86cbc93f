"""Operations of `ReplayBuffer` for evaluation requests: whoever drives a run asks, generator workers answer.

The vocabulary (request, shard, answer, report) is `evaluation/`'s; this module only carries it through Redis.

    eval_id = buf.request_evaluation(step=50, version=50, shards=4, max_prompts=1000)   # the learner / `sr1 run`
    request = buf.pop_evaluation_request("gen-0")            # a generator worker: one shard of the evaluation
    buf.post_evaluation_answer(request, {"items": [...], "eval/version": 50})
    answers = buf.wait_evaluation(eval_id, timeout_s=600)    # every shard's answer, once all are in

An evaluation is split into `shards` requests (one per generator worker, so they answer it together); shard i of k
answers every k-th selected prompt. Requests are a Redis list under `<namespace>:eval:requests`; a worker that pops
one holds it in `<namespace>:eval:taken:<worker>` until it posts its answer, so a worker that dies mid-evaluation
gives its requests back when it restarts (`requeue_evaluations`). Answers live under
`<namespace>:eval:result:<request id>` until whoever asked has recorded them (`forget_evaluation`), 7 days at most. A request that is not a JSON object with a string `id` is counted
(`<namespace>:eval:malformed`) and reported; an answer that is not a JSON object is a `MalformedJSON` naming its
shard. Both are decoded by buffer/guarded_json.py.

Each write is safe to send again when its reply was lost: a request is queued once (its shard count is set with NX
in the same script), a worker whose pop lost its reply gets that request again at its next pop, an answer overwrites
itself, and a malformed request is counted once.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from buffer import lua
from buffer.guarded_json import decode_json

RESULT_TTL_S = 7 * 24 * 3600


class EvaluationRequests:
    """Mixed into `ReplayBuffer` (buffer/redis_buffer.py), whose `_redis` and `key()` it uses."""

    def request_evaluation(self, *, step: int, version: int, shards: int = 1, **spec: Any) -> str:
        """Ask for an evaluation of the policy at `version` or newer, split into `shards` requests; returns its id.
        `spec` travels with every shard (max_prompts, max_per_source, greedy, samples). Sent again after a lost
        reply, nothing is queued twice (buffer/lua.py REQUEST_EVALUATION)."""
        if shards < 1:
            raise ValueError(f"an evaluation needs at least one shard, got {shards}")
        eval_id = f"eval-{step}-{uuid.uuid4().hex[:8]}"
        requests = [
            json.dumps(
                spec
                | {
                    "id": f"{eval_id}#{i}",
                    "eval_id": eval_id,
                    "shard": [i, shards],
                    "step": int(step),
                    "version": int(version),
                }
            )
            for i in range(shards)
        ]
        keys = [self.key("eval", "shards", eval_id), self.key("eval", "requests")]
        self._script(lua.REQUEST_EVALUATION, keys, [RESULT_TTL_S, shards, *requests])
        return eval_id

    def pop_evaluation_request(self, worker_id: str) -> dict[str, Any] | None:
        """The oldest request, now held by `worker_id` until it posts its answer; None when there is none.
        Raises ValueError (after counting it and dropping it) for a malformed one. A worker answers one request at a
        time: a request it still holds is one whose pop lost its reply, and is returned again."""
        taken = self.key("eval", "taken", worker_id)
        raw = self._script(lua.POP_EVALUATION, [self.key("eval", "requests"), taken], [])
        if raw is None:
            return None
        try:
            request = decode_json(raw, "an evaluation request")
            if not isinstance(request.get("id"), str):
                raise ValueError("an evaluation request needs a string 'id'")
        except ValueError as err:
            self._script(lua.DROP_MALFORMED_EVALUATION, [taken, self.key("eval", "malformed")], [raw])
            raise ValueError(f"malformed eval request {raw[:200]!r}: {err}") from None
        request["_raw"] = raw.decode() if isinstance(raw, bytes) else raw
        request["_worker"] = worker_id
        return request

    def post_evaluation_answer(self, request: dict[str, Any], answer: dict[str, Any]) -> None:
        """Store the answer to a popped request and release it from its worker (sent again: the same answer is set
        again, nothing is left to release)."""
        pipe = self._redis.pipeline(transaction=True)
        pipe.set(self.key("eval", "result", request["id"]), json.dumps(answer), ex=RESULT_TTL_S)
        pipe.lrem(self.key("eval", "taken", request["_worker"]), 1, request["_raw"])
        pipe.execute()

    def requeue_evaluations(self, worker_id: str) -> int:
        """Put the requests `worker_id` held when it died back in front of the queue; returns how many (a move whose
        reply was lost is not counted, and the loop goes on until the worker holds none)."""
        moved = 0
        while self._redis.lmove(
            self.key("eval", "taken", worker_id), self.key("eval", "requests"), "RIGHT", "LEFT"
        ):
            moved += 1
        return moved

    def evaluation_answers(self, eval_id: str) -> list[dict[str, Any]] | None:
        """Every shard's answer once all are in (in shard order), else None."""
        shards = self._redis.get(self.key("eval", "shards", eval_id))
        if shards is None:
            raise KeyError(f"no evaluation {eval_id!r} was requested (or it expired)")
        keys = [self.key("eval", "result", f"{eval_id}#{i}") for i in range(int(shards))]
        raw = self._redis.mget(keys)
        if any(r is None for r in raw):
            return None
        return [
            decode_json(r, f"the answer to evaluation shard {key}") for key, r in zip(keys, raw, strict=True)
        ]

    def forget_evaluation(self, eval_id: str) -> None:
        """Delete an evaluation's answers and its shard count, once whoever asked has recorded them. Left to their
        TTL, a long run kept every evaluation's answers in Redis for a week (tens of KB each)."""
        shards_key = self.key("eval", "shards", eval_id)
        shards = int(self._redis.get(shards_key) or 0)
        results = [self.key("eval", "result", f"{eval_id}#{i}") for i in range(shards)]
        self._redis.delete(shards_key, *results)

    def wait_evaluation(self, eval_id: str, timeout_s: float) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            answers = self.evaluation_answers(eval_id)
            if answers is not None:
                return answers
            time.sleep(0.25)
        raise TimeoutError(
            f"generators did not answer every shard of evaluation {eval_id} within {timeout_s:.0f}s"
        )
