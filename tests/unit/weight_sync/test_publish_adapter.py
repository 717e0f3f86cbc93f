"""`WeightPublisher.publish(..., adapter=, probe=)`: the update record carries the adapter's config and the probe, the
tensors arrive as sent, and a malformed adapter or probe is refused with an error naming what is wrong."""

from __future__ import annotations

import threading

import pytest
import torch

from fakes.receiver import join_group, wait_update
from tests.timing import scaled
from weight_sync.publisher import WeightPublisher
from weight_sync.receiver import receive_update
from weight_sync.rendezvous import Rendezvous
from weight_sync.settings import WeightSyncConfig

NS = "wsadapter"
ADAPTER = {
    "peft_type": "LORA",
    "r": 4,
    "lora_alpha": 8,
    "lora_dropout": 0.0,
    "target_modules": ["q_proj", "v_proj"],
    "bias": "none",
}
PROBE = {"token_ids": [5, 7, 9], "logprobs": [-1.5, torch.tensor(-0.25).item()]}


def _lora_tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    prefix = "base_model.model.model.layers.0.self_attn"
    return {
        f"{prefix}.q_proj.lora_A.weight": torch.randn(4, 32, generator=g),
        f"{prefix}.q_proj.lora_B.weight": torch.randn(32, 4, generator=g),
        f"{prefix}.v_proj.lora_A.weight": torch.randn(4, 32, generator=g),
        f"{prefix}.v_proj.lora_B.weight": torch.randn(16, 4, generator=g),
    }


def test_an_adapter_update_carries_its_config_and_probe(redis_url):
    tensors = _lora_tensors()
    got: dict = {}

    def receive() -> None:
        with Rendezvous(redis_url, NS) as rv:
            group, _ = join_group(rv, "eng0", timeout_s=scaled(30))
            update = wait_update(rv, group, -1, deadline=float("inf"), worker_id="eng0")
            got["update"] = update
            got["tensors"] = {name: t.clone() for name, t in receive_update(group, update)}
            rv.ack_update(int(update["version"]), "eng0")
            group.close()

    with Rendezvous(redis_url, NS) as rv:
        pub = WeightPublisher(rv, WeightSyncConfig(timeout_s=30), num_engines=1)
        thread = threading.Thread(target=receive, daemon=True)
        thread.start()
        try:
            pub.connect()
            stats = pub.publish(
                tensors.items(), version=1, dtype=torch.bfloat16, adapter=ADAPTER, probe=PROBE
            )
        finally:
            thread.join(scaled(30))
            pub.close()
    update = got["update"]
    assert update["adapter"] == ADAPTER
    assert update["probe"] == {"token_ids": [5, 7, 9], "logprobs": [-1.5, -0.25]}
    assert stats["weight_sync/bytes"] == sum(t.numel() * 2 for t in tensors.values())
    for name, tensor in tensors.items():
        assert torch.equal(got["tensors"][name], tensor.to(torch.bfloat16)), name


def test_a_full_weight_update_has_no_adapter(redis_url):
    with Rendezvous(redis_url, NS) as rv:
        pub = WeightPublisher(rv, WeightSyncConfig(), num_engines=0)
        stats = pub.publish(_lora_tensors().items(), version=1)
        assert stats["weight_sync/engines"] == 0
        assert rv.latest_update() is None  # nobody listening: nothing announced


@pytest.mark.parametrize(
    "adapter, match",
    [
        ({"r": 4, "lora_alpha": 8}, r"adapter config lacks \['target_modules'\]"),
        ({**ADAPTER, "peft_type": "IA3"}, "peft_type must be 'LORA'"),
        ({**ADAPTER, "r": 0}, "rank r must be a positive int"),
        ("lora", "adapter must be a dict"),
    ],
)
def test_a_malformed_adapter_is_refused(redis_url, adapter, match):
    with Rendezvous(redis_url, NS) as rv:
        pub = WeightPublisher(rv, WeightSyncConfig(), num_engines=0)
        with pytest.raises(ValueError, match=match):
            pub.publish(_lora_tensors().items(), version=1, adapter=adapter)


@pytest.mark.parametrize(
    "probe, match",
    [
        ({"token_ids": [1, 2, 3], "logprobs": [-1.0]}, "got 3 token ids and 1 log-probs"),
        ({"token_ids": [1]}, "probe must be a dict with token_ids and logprobs"),
    ],
)
def test_a_malformed_probe_is_refused(redis_url, probe, match):
    with Rendezvous(redis_url, NS) as rv:
        pub = WeightPublisher(rv, WeightSyncConfig(), num_engines=0)
        with pytest.raises(ValueError, match=match):
            pub.publish(_lora_tensors().items(), version=1, probe=probe)
