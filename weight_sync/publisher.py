"""Learner side of weight sync: `WeightPublisher` (learner rank 0 only) pushes full weights to every engine (to every
worker of a tensor-parallel engine: each is a member of the group and loads its own shards).

    pub = WeightPublisher(Rendezvous(redis_url, namespace), cfg.weight_sync, num_engines=4)
    pub.connect()                                   # TCP store + rendezvous in Redis; waits for every engine
    stats = pub.publish(model.named_parameters(), version=7, dtype=torch.bfloat16)
    buffer.publish_version(7)

`publish` plans buckets of `bucket_mb` from the names/shapes (DTensor shapes are global, so nothing is gathered
yet), announces the layout in Redis, then pipelines: bucket k is broadcast asynchronously while bucket k+1 is
gathered (`DTensor.full_tensor()`) and packed into the other of two staging buffers. A tensor of at least
`in_place_mb` that needs no conversion (fp32 weights published as fp32, a DTensor, whose gather yields a fresh tensor
in the wire dtype) gets a bucket of its own and goes on the wire from its own memory, with no copy. It then waits
for every engine's ack. Each blocking step has `timeout_s`; a dead engine makes `publish` raise `WeightSyncError` (or
TimeoutError for acks; at once when the engine stopped announcing itself), and so does a Redis still unavailable when
the layout is announced, after finishing the gathers so the other FSDP ranks stay in step. The learner survives
that: the next `publish` re-opens the group under a new epoch.

Membership. The first `connect` waits for `num_engines` engines. After that, every group is formed from the engines
that announce themselves alive (`Rendezvous.announce_engine`): `needs_regroup()` is true when one of the group's
engines stopped announcing itself or a new one appeared, and the next `publish` re-forms the group first (the learner
also calls it while it waits for a batch, so a restarted or new engine gets the current weights at once). With no
engine alive, a publish only takes part in the gathers.

FSDP2: every learner rank must call `full_tensor()` on the same parameters in the same order. Either pass DTensors
to `publish` on rank 0 and call `gather_in_step(named_params, dtype)` on the other ranks (streaming: at most two
buckets' worth of full tensors alive at a time), or pass an iterator that calls `full_tensor()` itself (correct, but
rank 0 then holds a full copy while planning).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from collections import deque
from collections.abc import Iterable, Iterator

import torch

from buffer.connection import RETRIED as REDIS_UNAVAILABLE
from weight_sync.buckets import (
    bucket_offsets,
    bytes_in_place,
    dtype_to_str,
    entry_nbytes,
    pack_into,
    plan_buckets,
)
from weight_sync.process_group import SyncGroup, WeightSyncError, make_group, open_store, resolve_backend
from weight_sync.rendezvous import Rendezvous, describe_members, to_jsonable
from weight_sync.settings import WeightSyncConfig

log = logging.getLogger(__name__)


def gather_for_wire(tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """The unsharded tensor, for the wire: a DTensor is cast to the wire `dtype` shard by shard first and then
    gathered (a collective on its mesh), so a bf16 publish of fp32 weights all-gathers half the bytes and
    no rank holds an fp32 copy of the full tensor; the values are those of casting after the gather. Plain
    tensors are returned as they are (packing converts them)."""
    gather = getattr(tensor, "full_tensor", None)
    if gather is None:
        return tensor
    if dtype is not None and tensor.dtype != dtype:
        return tensor.to(dtype).full_tensor()
    return gather()


@contextlib.contextmanager
def _single_thread_on_cpu(device: torch.device, sending: bool):
    """Pack copies are memory-bound; on CPU, while a bucket is on the wire, intra-op threads only fight gloo's
    send thread for the cores (measured here: 19.5M fp32->bf16 copies took 0.04 s on one thread, 0.6 s on two
    contended ones). With nothing in flight (the first bucket) every thread packs."""
    if device.type != "cpu" or not sending:
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def gather_in_step(
    named_tensors: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype | None = None
) -> None:
    """Learner ranks other than 0: take part in the gathers that rank 0's `publish(..., dtype=dtype)` performs
    (same tensors, same order, same wire `dtype`)."""
    for _, tensor in named_tensors:
        gather_for_wire(tensor.detach(), dtype)


class WeightPublisher:
    """Learner rank 0's end of the weight-sync group (see the module docstring).

    `rendezvous` stays the caller's: `close()` withdraws the rendezvous but leaves its Redis client open.
    """

    def __init__(self, rendezvous: Rendezvous, cfg: WeightSyncConfig, num_engines: int):
        if num_engines < 0:
            raise ValueError(f"num_engines must be >= 0, got {num_engines}")
        self.rendezvous = rendezvous
        self.cfg = cfg
        self.enabled = num_engines > 0  # 0: the learner trains alone (tests, a weight sink)
        self.num_engines = num_engines  # the engines of the current group (the first connect waits for these)
        self.backend = resolve_backend(cfg.backend)
        self.group: SyncGroup | None = None
        self.epoch = 0
        self.members: dict[int, str] = {}
        self._store = None
        self._staging: list[torch.Tensor] = []
        self.failures = 0  # publishes that raised (an engine died or hung)
        self._connected_once = False
        self._regroup_checked = 0.0
        self._regroup_cached = False
        self._unacked: int | None = None  # the version a publish sent without waiting for its acks

    # 1. group management ------------------------------------------------------------------------------------
    def needs_regroup(self, max_age_s: float = 1.0) -> bool:
        """Whether the group must be re-formed before the next publish: it is broken or was never formed, one of its
        engines stopped announcing itself, or an engine it lacks announces itself (checked at most every
        `max_age_s`; Redis is asked then)."""
        if not self.enabled:
            return False
        if self.group is None and (not self._connected_once or self.rendezvous.live_engines()):
            return True
        now = time.monotonic()
        if now - self._regroup_checked >= max_age_s:
            self._regroup_checked = now
            live = self.rendezvous.live_engines()
            members = set(self.members.values())
            gone = {m for m in members - live if m in self.rendezvous.announced_engines()}
            self._regroup_cached = bool(gone or (live - members))
        return self._regroup_cached

    def regroup(self) -> None:
        """Re-form the group: the first time with `num_engines` engines, then with the engines alive now."""
        self._regroup_cached = False
        if not self._connected_once:
            self._connected_once = (
                True  # a first connect that times out falls back to the engines alive later
            )
            self.connect()
            return
        live = self.rendezvous.live_engines()
        self.num_engines = len(live)
        if self.num_engines == 0:
            self._drop_group()
            log.warning("weight sync: no engine is alive; the weights wait for the next one to appear")
            return
        self.connect()

    def connect(self, timeout_s: float | None = None) -> None:
        """Open the TCP store, publish the rendezvous, wait until `num_engines` engines joined (new epoch each
        call)."""
        if not self.enabled or self.num_engines == 0:
            return
        timeout_s = self.cfg.timeout_s if timeout_s is None else timeout_s
        self._drop_group()
        if self._store is None:
            self._store = open_store(
                self.cfg.master_addr, self.cfg.master_port or 0, is_master=True, timeout_s=self.cfg.timeout_s
            )
        # A fresh epoch per connect: engines still in an old group see it and re-join.
        self.epoch = self.rendezvous.next_epoch()
        info = {
            "addr": self._advertised_addr(),
            "port": int(self._store.port),
            "backend": self.backend,
            "epoch": self.epoch,
            "timeout_s": self.cfg.timeout_s,
            "join_timeout_s": timeout_s,
            "keep_buffers": self.cfg.keep_receive_buffers,
        }
        self.rendezvous.publish(info)
        log.info(
            "weight sync: waiting for %d engine(s) at %s:%d (epoch %d)",
            self.num_engines,
            info["addr"],
            info["port"],
            self.epoch,
        )
        self.members = self.rendezvous.wait_members(self.epoch, self.num_engines, timeout_s)
        self._connected_once = True
        # Close the group at the ranks claimed so far: one per engine worker (a tensor-parallel engine's workers
        # each take part in every broadcast and load their own shards), and every engine that claimed in time.
        self.num_engines = len(set(self.members.values()))
        self.group = make_group(
            self._store,
            rank=0,
            world_size=len(self.members) + 1,
            backend=self.backend,
            epoch=self.epoch,
            timeout_s=self.cfg.timeout_s,
            connect_timeout_s=timeout_s,
        )
        log.info(
            "weight sync: %d engine(s) joined epoch %d: %s",
            self.num_engines,
            self.epoch,
            describe_members(self.members),
        )

    def _advertised_addr(self) -> str:
        addr = self.cfg.master_addr
        if addr in ("0.0.0.0", ""):
            return socket.gethostbyname(socket.gethostname())
        return addr

    def _drop_group(self) -> None:
        self._staging = []
        if self.group is not None:
            self.group.close()
            self.group = None

    def close(self) -> None:
        """Leave the group, withdraw the rendezvous, close the store."""
        self._drop_group()
        if self._store is not None:
            info = self.rendezvous.read()
            if info is not None and info["epoch"] == self.epoch:
                self.rendezvous.clear()
            self._store = None

    # 2. publish ---------------------------------------------------------------------------------------------
    def publish(
        self,
        named_tensors: Iterable[tuple[str, torch.Tensor]],
        version: int,
        dtype: torch.dtype | None = None,
        adapter: dict | None = None,
        probe: dict | None = None,
        *,
        regroup: bool = True,
        wait_acks: bool = True,
    ) -> dict:
        """Broadcast `named_tensors` as `version` to every engine and wait for their acks; returns stats.

        Full weights by default. With `adapter` (the PEFT `adapter_config.json` contents), the tensors are a LoRA
        adapter's (`peft.get_peft_model_state_dict` names) and the engines load them as a new vLLM adapter
        `sr1-v{version}` beside the older ones, without pausing. `probe` (`{"token_ids", "logprobs"}`: the learner's
        log-probs of tokens 1..n-1 at this version) lets each engine check that it samples from what it loaded.
        Both travel in the update record. Raises WeightSyncError or TimeoutError when an engine fails; the gathers
        are finished first either way. `regroup=False`: the caller re-formed the group before (`regroup` when
        `needs_regroup`); `wait_acks=False`: the caller waits for the acks after (`wait_for_acks`). A learner of several
        ranks does both apart, so that its other ranks never wait inside a gather meanwhile (learner/loop.py)."""
        check_adapter(adapter)
        check_probe(probe)
        items = iter([(name, tensor.detach()) for name, tensor in named_tensors])
        self._unacked = None
        try:
            if regroup and self.needs_regroup(max_age_s=0.0):
                self.regroup()
        except (WeightSyncError, TimeoutError):
            self.failures += 1
            gather_in_step(items, dtype)  # keep the other FSDP ranks in step
            raise
        if self.group is None:
            gather_in_step(items, dtype)  # nobody listening: take part in the gathers all the same
            return {
                "weight_sync/seconds": 0.0,
                "weight_sync/bytes": 0,
                "weight_sync/gbps": 0.0,
                "weight_sync/buckets": 0,
                "weight_sync/in_place_bytes": 0,
                "weight_sync/engines": 0,
                "weight_sync/failures": self.failures,
            }
        start = time.perf_counter()
        items = list(items)
        buckets = self.plan(items, dtype)
        update = {
            "version": int(version),
            "epoch": self.epoch,
            "buckets": to_jsonable(buckets),
            "dtype": dtype_to_str(dtype) if dtype is not None else "mixed",
        }
        if adapter is not None:
            update["adapter"] = adapter
        if probe is not None:
            update["probe"] = {
                "token_ids": [int(t) for t in probe["token_ids"]],
                "logprobs": [float(x) for x in probe["logprobs"]],
            }
        remaining = iter(items)
        try:
            try:
                self.rendezvous.announce_update(update)
                total_bytes, in_place_bytes = self._broadcast_buckets(remaining, buckets, version, dtype)
            except (WeightSyncError, TimeoutError, *REDIS_UNAVAILABLE) as err:
                gather_in_step(remaining, dtype)  # the other FSDP ranks are still gathering: finish with them
                if isinstance(err, REDIS_UNAVAILABLE):  # past buffer.reconnect_s: no engine knows of it
                    why = f"the update of version {version} could not be announced: {err}"
                    raise WeightSyncError(why) from err
                raise
            if not wait_acks:
                self._unacked = version
            else:
                self.rendezvous.wait_acks(
                    version, self.num_engines, self.cfg.timeout_s, expected=self.members
                )
        except WeightSyncError as exc:
            # The group is unusable after a failed collective; the next publish re-opens it (new epoch).
            self.failures += 1
            self._drop_group()
            engines = describe_members(self.members)
            raise WeightSyncError(
                f"publish of version {version} failed; engines in the group: {engines}. {exc}"
            ) from exc
        except TimeoutError:
            self.failures += 1
            self._drop_group()
            raise
        seconds = time.perf_counter() - start
        return {
            "weight_sync/seconds": seconds,
            "weight_sync/bytes": total_bytes,
            "weight_sync/gbps": total_bytes * 8 / seconds / 1e9,
            "weight_sync/buckets": len(buckets),
            "weight_sync/in_place_bytes": in_place_bytes,  # sent from the tensors' own memory, not packed
            "weight_sync/engines": self.num_engines,
            "weight_sync/failures": self.failures,
        }

    def wait_for_acks(self, version: int) -> None:
        """After `publish(..., wait_acks=False)` of `version`: every engine's ack, waited for and failed as `publish`
        does (TimeoutError; the group is re-formed at the next publish). Nothing to wait for when that publish sent
        nothing (no engine, or it failed)."""
        if self._unacked != version or self.group is None:
            return
        self._unacked = None
        try:
            self.rendezvous.wait_acks(version, self.num_engines, self.cfg.timeout_s, expected=self.members)
        except TimeoutError:
            self.failures += 1
            self._drop_group()
            raise

    def plan(self, named_tensors: list[tuple[str, torch.Tensor]], dtype: torch.dtype | None) -> list:
        """The buckets of (name, wire dtype, shape) a publish of `named_tensors` in `dtype` sends: `bucket_mb` each,
        the first a quarter of that (gathering and packing it is the one step no broadcast overlaps). A tensor of
        `in_place_mb` or more that needs no conversion (already in `dtype`, or a DTensor, which is gathered in it)
        gets a bucket of its own, sent from its memory. Nothing is gathered: a DTensor reports its global shape."""
        entries, alone = [], set()
        in_place_bytes = self.cfg.in_place_mb * 2**20
        for name, tensor in named_tensors:
            entry = (name, dtype_to_str(dtype or tensor.dtype), list(tensor.shape))
            entries.append(entry)
            no_conversion = dtype in (None, tensor.dtype) or hasattr(tensor, "full_tensor")
            if in_place_bytes and no_conversion and entry_nbytes(entry) >= in_place_bytes:
                alone.add(name)
        return plan_buckets(
            entries, self._bucket_bytes, first_bucket_bytes=self._bucket_bytes // 4, alone=alone
        )

    @property
    def _bucket_bytes(self) -> int:
        return int(self.cfg.bucket_mb * 2**20)

    def _staging_buffer(self, slot: int, nbytes: int, device: torch.device) -> torch.Tensor:
        """Staging buffer `slot` (of two), kept between publishes and grown on demand (fresh large buffers would be
        page-faulted in every time)."""
        while len(self._staging) <= slot:
            self._staging.append(torch.empty(0, dtype=torch.uint8, device=device))
        held = self._staging[slot]
        if held.numel() < nbytes or held.device != device:
            held = self._staging[slot] = torch.empty(nbytes, dtype=torch.uint8, device=device)
        return held[:nbytes]

    def _broadcast_buckets(
        self, items: Iterator, buckets: list, version: int, dtype: torch.dtype | None
    ) -> tuple[int, int]:
        """Gather bucket k+1 (in the wire `dtype`) while bucket k is on the wire. A bucket that is one tensor already
        in the wire dtype is sent from that tensor's memory; the others are packed into whichever of two staging
        buffers is not on the wire. At most two buckets' worth of bytes are in flight (gathered tensors stay alive
        until sent). Returns (bytes sent, bytes sent in place)."""
        group = self.group
        assert group is not None
        sizes = [bucket_offsets(b)[1] for b in buckets]
        budget = max(2 * self._bucket_bytes, *sizes)
        in_flight: deque = deque()  # (work, staging slot or None, nbytes, payload kept alive), oldest first
        sent = packed = in_place = 0

        def wait_oldest() -> None:
            work = in_flight.popleft()[0]
            group.wait(work, f"sending bucket {sent - len(in_flight)}/{len(buckets)} of version {version}")

        for bucket, nbytes in zip(buckets, sizes, strict=True):
            tensors = [gather_for_wire(next(items)[1], dtype).to(group.device) for _ in bucket]
            payload, slot = bytes_in_place(bucket, tensors), None
            if payload is not None:
                in_place += nbytes
            else:
                slot, packed = packed % 2, packed + 1
                while any(entry[1] == slot for entry in in_flight):
                    wait_oldest()
                payload = self._staging_buffer(slot, nbytes, group.device)
                with _single_thread_on_cpu(group.device, sending=bool(in_flight)):
                    pack_into(payload, bucket, tensors)
            while in_flight and sum(entry[2] for entry in in_flight) + nbytes > budget:
                wait_oldest()
            if group.backend == "nccl":
                torch.cuda.current_stream().synchronize()
            in_flight.append((group.broadcast(payload), slot, nbytes, payload))
            sent += 1
        while in_flight:
            wait_oldest()
        return sum(sizes), in_place


_ADAPTER_KEYS = ("r", "lora_alpha", "target_modules")


def check_adapter(adapter: dict | None) -> None:
    """An adapter description must be a PEFT LoRA `adapter_config.json` (JSON-able dict with r, lora_alpha,
    target_modules, peft_type "LORA"); raises ValueError naming what is wrong."""
    if adapter is None:
        return
    if not isinstance(adapter, dict):
        raise ValueError(
            f"adapter must be a dict (PEFT adapter_config.json contents), got {type(adapter).__name__}"
        )
    missing = [key for key in _ADAPTER_KEYS if key not in adapter]
    if missing:
        raise ValueError(f"adapter config lacks {missing}; got keys {sorted(adapter)}")
    if str(adapter.get("peft_type", "LORA")).upper() != "LORA":
        raise ValueError(f"adapter peft_type must be 'LORA', got {adapter['peft_type']!r}")
    if not isinstance(adapter["r"], int) or adapter["r"] <= 0:
        raise ValueError(f"adapter rank r must be a positive int, got {adapter['r']!r}")


def check_probe(probe: dict | None) -> None:
    """A probe is `{"token_ids": [n ints], "logprobs": [n - 1 floats]}` (n >= 2); raises ValueError otherwise."""
    if probe is None:
        return
    if not isinstance(probe, dict) or not {"token_ids", "logprobs"} <= set(probe):
        keys = sorted(probe) if isinstance(probe, dict) else type(probe).__name__
        raise ValueError(f"probe must be a dict with token_ids and logprobs, got {keys}")
    n, m = len(probe["token_ids"]), len(probe["logprobs"])
    if n < 2 or m != n - 1:
        raise ValueError(
            f"probe needs n >= 2 token_ids and the log-probs of tokens 1..n-1 (n - 1 values); got {n} token ids "
            f"and {m} log-probs"
        )
