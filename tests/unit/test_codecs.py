"""Codecs for payloads at rest (API.md §10): round trips, chains, key rotation, envelopes, and
settings refused at load with an error that says what to fix."""

from __future__ import annotations

import zlib

import pytest
from cryptography.fernet import Fernet as FernetKeys
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from durable import codecs, conf
from durable.errors import PayloadUndecodable

KEY_A, KEY_B = FernetKeys.generate_key().decode(), FernetKeys.generate_key().decode()
DATA = b'{"card":"4242 4242 4242 4242","note":"' + b"x" * 200 + b'"}'


class Reversed:
    """A project's own codec, found by dotted path."""

    def encode(self, data: bytes) -> bytes:
        return data[::-1]

    def decode(self, data: bytes) -> bytes:
        return data[::-1]


@pytest.fixture(autouse=True)
def _fresh_settings():
    conf.reset()
    yield
    conf.reset()


def test_zlib_round_trips_and_shrinks_repetitive_json():
    codec = codecs.Zlib()
    assert codec.decode(codec.encode(DATA)) == DATA
    assert len(codec.encode(DATA)) < len(DATA)


def test_fernet_round_trips_and_never_encrypts_the_same_bytes_alike():
    codec = codecs.Fernet([KEY_A])
    assert codec.decode(codec.encode(DATA)) == DATA
    assert codec.encode(DATA) != codec.encode(DATA)
    assert b"4242" not in codec.encode(DATA)


def test_a_chain_encodes_in_order_and_decodes_in_reverse():
    chain = codecs.build([codecs.Zlib, codecs.Fernet], [KEY_A])
    encoded = chain.encode(DATA)
    assert zlib.decompress(codecs.Fernet([KEY_A]).decode(encoded)) == DATA
    assert chain.decode(encoded) == DATA


def test_the_first_key_encrypts_and_every_key_decrypts_so_keys_rotate():
    written_under_a = codecs.seal({"card": "4242"}, codecs.build([codecs.Fernet], [KEY_A]))
    rotated = codecs.build([codecs.Fernet], [KEY_B, KEY_A])
    assert codecs.unseal(written_under_a, rotated) == {"card": "4242"}
    written_under_b = codecs.seal({"card": "4242"}, rotated)
    assert codecs.unseal(written_under_b, codecs.build([codecs.Fernet], [KEY_B])) == {"card": "4242"}


def test_an_envelope_no_key_opens_fails_with_payload_undecodable():
    sealed = codecs.seal({"card": "4242"}, codecs.build([codecs.Fernet], [KEY_A]))
    with pytest.raises(PayloadUndecodable) as refused:
        codecs.unseal(sealed, codecs.build([codecs.Fernet], [KEY_B]))
    assert refused.value.code == "payload_undecodable"
    assert "CODEC_KEYS" in refused.value.message
    with pytest.raises(PayloadUndecodable, match='DURABLE\\["CODEC"\\] is not set'):
        codecs.unseal(sealed, None)


def test_an_envelope_is_a_small_tagged_dict_that_plain_and_tagged_values_never_look_like():
    sealed = codecs.seal([1, 2], codecs.Chain([codecs.Zlib()]))
    assert set(sealed) == {"__durable__", "v"} and sealed["__durable__"] == "encoded"
    assert codecs.is_sealed(sealed)
    assert not codecs.is_sealed({"__durable__": "decimal", "v": "1.5"})
    assert not codecs.is_sealed({"v": "x"}) and not codecs.is_sealed([sealed]) and not codecs.is_sealed(None)


def test_settings_build_the_codec_from_dotted_paths_including_a_projects_own_class():
    with override_settings(DURABLE={"CODEC": [f"{__name__}.Reversed", "durable.codecs.Zlib"]}):
        chain = conf.codec()
        assert [type(c) for c in chain.codecs] == [Reversed, codecs.Zlib]
        assert chain.decode(chain.encode(DATA)) == DATA
    with override_settings(DURABLE={}):
        assert conf.codec() is None


@pytest.mark.parametrize(
    ("durable_setting", "said"),
    [
        ({"CODEC": "durable.codecs.Nope"}, "cannot import 'durable.codecs.Nope'"),
        ({"CODEC": "durable.codecs.Fernet"}, 'needs DURABLE["CODEC_KEYS"]'),
        (
            {"CODEC": "durable.codecs.Fernet", "CODEC_KEYS": ["not a key"]},
            "CODEC_KEYS[0] is not a Fernet key",
        ),
        ({"CODEC": "durable.conf.Settings"}, "is no codec"),
        ({"CODEC": 3}, "must be None, a dotted path"),
        ({"CODEC": "durable.codecs.Zlib", "CODEC_KEYS": KEY_A}, "must be a list of keys"),
    ],
)
def test_a_bad_codec_setting_is_refused_at_load_never_ignored(durable_setting, said):
    assert any(said in message for _, message in conf.problems(durable_setting))
    with override_settings(DURABLE=durable_setting), pytest.raises(ImproperlyConfigured) as refused:
        conf.get()
    assert said in str(refused.value)
