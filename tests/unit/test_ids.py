import uuid

from durable import ids

NS = 1_796_000_000_123_456_789  # an instant in 2026, in nanoseconds


def test_a_run_id_is_a_version_7_uuid_in_32_hex_digits_that_carries_its_millisecond():
    made = ids.run_id(NS)
    parsed = uuid.UUID(hex=made)
    assert len(made) == 32 and made == parsed.hex
    assert parsed.version == 7 and parsed.variant == uuid.RFC_4122
    assert int(made[:12], 16) == NS // 1_000_000


def test_ids_made_later_sort_later_even_within_one_millisecond():
    # A quarter of a microsecond apart is enough; the random bits decide only below that.
    instants = [NS + step * 250 for step in range(4000)]
    made = [ids.run_id(at) for at in instants]
    assert made == sorted(made)
    assert len(set(made)) == len(made)


def test_two_ids_of_the_same_instant_differ():
    assert ids.run_id(NS) != ids.run_id(NS)
