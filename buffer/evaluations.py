"""Operations of `ReplayBuffer` for evaluation requests: whoever drives a run asks, generator workers answer.

    request_id = buf.request_evaluation(step=50, version=50, max_prompts=200)    # the learner side / `sr1 run`
    request = buf.pop_evaluation_request("gen-0")                               # a generator worker
    buf.post_evaluation_result(request, {"eval/em": 0.41, ...})
    result = buf.wait_evaluation_result(request_id, timeout_s=600)

Requests are a Redis list under `<namespace>:eval:requests`; a worker that pops one holds it in
`<namespace>:eval:taken:<worker>` until it posts the result, so a worker that dies mid-evaluation gives its requests
back when it restarts (`requeue_evaluations`). Results live 7 days under `<namespace>:eval:result:<id>`. A request
that is not a JSON object with a string `id` is counted (`<namespace>:eval:malformed`) and reported.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

RESULT_TTL_S = 7 * 24 * 3600


class EvaluationRequests:
    """Mixed into `ReplayBuffer` (buffer/redis_buffer.py), whose `_redis` and `key()` it uses."""

    def request_evaluation(self, *, step: int, max_prompts: int, greedy: bool = True, **fields: Any) -> str:
        request_id = f"eval-{step}-{uuid.uuid4().hex[:8]}"
        payload = {
            "id": request_id,
            "step": int(step),
            "max_prompts": int(max_prompts),
            "greedy": bool(greedy),
        }
        self._redis.rpush(self.key("eval", "requests"), json.dumps(payload | fields))
        return request_id

    def pop_evaluation_request(self, worker_id: str) -> dict[str, Any] | None:
        """The oldest request, now held by `worker_id` until it posts the result; None when there is none.
        Raises ValueError (after counting it and dropping it) for a malformed one."""
        taken = self.key("eval", "taken", worker_id)
        raw = self._redis.lmove(self.key("eval", "requests"), taken, "LEFT", "RIGHT")
        if raw is None:
            return None
        try:
            request = json.loads(raw)
            if not isinstance(request, dict) or not isinstance(request.get("id"), str):
                raise ValueError("not an object with a string 'id'")
        except ValueError as err:
            self._redis.lrem(taken, 1, raw)
            self._redis.incr(self.key("eval", "malformed"))
            raise ValueError(f"malformed eval request {raw[:200]!r}: {err}") from None
        request["_raw"] = raw.decode() if isinstance(raw, bytes) else raw
        request["_worker"] = worker_id
        return request

    def post_evaluation_result(self, request: dict[str, Any], result: dict[str, Any]) -> None:
        """Store the result of a popped request and release it from its worker."""
        pipe = self._redis.pipeline(transaction=True)
        pipe.set(self.key("eval", "result", request["id"]), json.dumps(result), ex=RESULT_TTL_S)
        pipe.lrem(self.key("eval", "taken", request["_worker"]), 1, request["_raw"])
        pipe.execute()

    def requeue_evaluations(self, worker_id: str) -> int:
        """Put the requests `worker_id` held when it died back in front of the queue; returns how many."""
        moved = 0
        while self._redis.lmove(
            self.key("eval", "taken", worker_id), self.key("eval", "requests"), "RIGHT", "LEFT"
        ):
            moved += 1
        return moved

    def evaluation_result(self, request_id: str) -> dict[str, Any] | None:
        raw = self._redis.get(self.key("eval", "result", request_id))
        return None if raw is None else json.loads(raw)

    def wait_evaluation_result(self, request_id: str, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            result = self.evaluation_result(request_id)
            if result is not None:
                return result
            time.sleep(0.25)
        raise TimeoutError(f"no generator answered evaluation request {request_id} within {timeout_s:.0f}s")
