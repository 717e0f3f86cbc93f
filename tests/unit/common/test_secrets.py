"""The one masking of secrets: URL passwords and the values of secret fields, options and variables."""

from __future__ import annotations

import pytest

from common.secrets import (
    MASK,
    is_masked,
    is_secret_name,
    mask_argv,
    mask_config,
    mask_text,
    mask_url,
    masked_leaves,
)


@pytest.mark.parametrize(
    "name",
    ["token", "retrieval.token", "--token", "SR1_RETRIEVAL__TOKEN", "hf_token", "--api-key", "password"],
)
def test_secret_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["api_key_env", "max_tokens", "tokenizer_path", "redis_url", "--redis-url"])
def test_names_that_only_contain_a_secret_word_are_not_secrets(name):
    assert not is_secret_name(name)


def test_url_passwords():
    assert mask_url("redis://sr1:pw@10.0.0.1:6379/0") == "redis://sr1:***@10.0.0.1:6379/0"
    assert (
        mask_url("rediss://:pw@host:6380/2?ssl_ca_certs=/ca.pem")
        == "rediss://:***@host:6380/2?ssl_ca_certs=/ca.pem"
    )
    assert mask_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    assert mask_url("redis://u:p%40ss@[::1]:6379/0") == "redis://u:***@[::1]:6379/0"
    assert mask_url("redis://u:pw@host:notaport/0") == "redis://u:***@host:notaport/0"


def test_free_text():
    line = "sr1 run retrieval.token=t0k buffer.redis_url=redis://u:pw@h:1/0 --token abc --api-key=k"
    assert mask_text(line) == (
        "sr1 run retrieval.token=*** buffer.redis_url=redis://u:***@h:1/0 --token *** --api-key=***"
    )
    assert mask_text("SR1_RETRIEVAL__TOKEN=zz and http://h/r?token=abc&x=1") == (
        "SR1_RETRIEVAL__TOKEN=*** and http://h/r?token=***&x=1"
    )
    assert mask_text('{"token": "abc", "topk": 3}') == '{"token": "***", "topk": 3}'
    assert mask_text("token: abc") == "token: ***"
    prose = "the token is refused; max_tokens=5 api_key_env=SERPAPI_KEY"
    assert mask_text(prose) == prose


def test_command_lines():
    argv = [
        "sr1",
        "run",
        "--token",
        "abc",
        "retrieval.token=x",
        "--redis-url",
        "redis://u:p@h/0",
        "--token=q",
    ]
    assert mask_argv(argv) == [
        "sr1",
        "run",
        "--token",
        MASK,
        "retrieval.token=***",
        "--redis-url",
        "redis://u:***@h/0",
        "--token=***",
    ]
    assert mask_argv(["learner.lr=1e-6"]) == ["learner.lr=1e-6"]


def test_configs_and_what_they_hide():
    config = {
        "buffer": {"redis_url": "redis://u:pw@h:1/0"},
        "retrieval": {"token": "t0k", "client": {"url": "http://a:b@h/retrieve"}},
        "online": {"api_key_env": "SERPAPI_KEY", "hf_token": None},
        "files": ["redis://x:y@h/0"],
    }
    masked = mask_config(config)
    assert masked == {
        "buffer": {"redis_url": "redis://u:***@h:1/0"},
        "retrieval": {"token": MASK, "client": {"url": "http://a:***@h/retrieve"}},
        "online": {"api_key_env": "SERPAPI_KEY", "hf_token": None},
        "files": ["redis://x:***@h/0"],
    }
    assert config["retrieval"]["token"] == "t0k"  # a copy
    assert masked_leaves(config) == {
        "buffer.redis_url": "redis://u:pw@h:1/0",
        "retrieval.token": "t0k",
        "retrieval.client.url": "http://a:b@h/retrieve",
        "files.0": "redis://x:y@h/0",
    }
    assert masked_leaves(masked) == {}  # masking twice hides nothing more
    assert is_masked(MASK) and is_masked("redis://u:***@h:1/0")
    assert not is_masked("redis://u:pw@h:1/0") and not is_masked(None) and not is_masked("***x")
