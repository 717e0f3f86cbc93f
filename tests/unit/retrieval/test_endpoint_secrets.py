"""A failed call's reason (logged, and shown to the model as its observation) never holds the URL's password."""

from __future__ import annotations

import asyncio

import pytest

from retrieval.http_json import EndpointFailed, JsonEndpoint


def test_an_unreachable_endpoint_is_named_without_its_password(free_port):
    endpoint = JsonEndpoint(
        f"http://sr1:pw-4711@127.0.0.1:{free_port}/retrieve", what="the retrieval server", max_retries=0
    )

    async def call():
        try:
            return await endpoint.call({"queries": ["q"]}, lambda answer: answer)
        finally:
            await endpoint.close()

    with pytest.raises(EndpointFailed) as failed:
        asyncio.run(call())
    assert "pw-4711" not in str(failed.value)
    assert f"http://sr1:***@127.0.0.1:{free_port}/retrieve" in str(failed.value)
